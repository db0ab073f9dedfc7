"""Segmentation models for COCO-Stuff, each with the paper's shape node.

``forward(x) -> (logits (B, num_classes, H, W), u)``: ``u`` is the regularizer's score, the paper's
"extra node" (``reparam.ShapeHead``): one linear layer on image-level features, here the globally
average-pooled deepest encoder features, read in the same forward pass as the logits (spec sec. 6:
on COCO-Stuff the shape label of an image says whether its objects are small or big, so the node
sees the whole image). ``u`` is ``(B,)`` for one shape score, ``(B, shape_scores)`` for several
(multi-class shape, one column per bin).

Architectures: every segmentation-models-pytorch (smp) architecture with any smp or ``tu-`` (timm)
encoder, and SegNet (VGG16-bn encoder from torchvision, decoder unpooling with the encoder's max-pool
indices), which smp does not have.

Inputs of any size: the input is zero-padded at the bottom and right to the multiple the network
needs (smp: the encoder's output stride, times 8 for PAN and 2 for DPT, whose decoders downsample
further; SegNet: 32) and the logits are cropped back to ``(H, W)``; 106 x 160 runs as 112 x 160
for DeepLabV3+. Zero, not reflect: after ImageNet normalization zero is the mean colour, so padding
adds no content, while a reflection would mirror objects at the border and inflate the object
sizes the shape node is asked to judge; zero also works for any size (reflect needs the pad to be
smaller than the image) and is what every convolution already sees beyond the border.

The shape node averages only the cells of the deepest feature map that cover the image,
``ceil(H / s)`` x ``ceil(W / s)`` at stride ``s`` (cells that also see some padding are kept: their
receptive fields overlap the image anyway). Where the multiple is the deepest stride (DeepLabV3+,
Unet, FPN, SegNet, ...) the pad is less than one cell and this is every cell; PAN and DPT pad by
more, and the cells of padding only are left out.

Pretrained weights (``encoder_weights``): ``None`` (random), an smp / torchvision name (downloaded
into the Hugging Face or torch hub cache), or a local ``.pth``/``.pt``/``.safetensors`` file with
the encoder's state dict. Without network a missing download fails in seconds with a
``RuntimeError`` that says how to fix it, instead of the Hugging Face client's retries.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import socket
import threading
import urllib.parse
import urllib.request
from pathlib import Path

import huggingface_hub.constants as hf_constants
import segmentation_models_pytorch as smp
import timm
import torch
import torch.nn.functional as F
from huggingface_hub.errors import HfHubHTTPError
from safetensors.torch import load_file
from torch import Tensor, nn
from torchvision.models import VGG16_BN_Weights
from torchvision.models.vgg import cfgs as vgg_cfgs
from torchvision.models.vgg import make_layers

from reparam import ShapeHead

SEGNET_MULTIPLE = 32  # five 2x2 max pools
# smp architectures whose decoder downsamples the deepest encoder features further (PAN's feature
# pyramid attention: three 2x2 max pools; DPT: its deepest reassembled map is at twice the patch
# stride), then upsamples 2x to meet them: input multiple = encoder output stride x this (smp's
# own check_input_shape asks for the output stride only, and odd sizes then crash)
EXTRA_DOWNSAMPLING = {"pan": 8, "dpt": 2}
# smp keyword arguments per architecture: DPT's ViT encoder takes any size (multiple of the patch)
SMP_KWARGS: dict[str, dict] = {"dpt": {"dynamic_img_size": True}}
VGG16_STAGES = ((64, 64), (128, 128), (256, 256, 256), (512, 512, 512), (512, 512, 512))  # "D"
WEIGHT_FILE_SUFFIXES = (".pth", ".pt", ".safetensors")
PROBE_TIMEOUT_S = 3.0


def architectures() -> list[str]:
    """The valid ``arch`` names: smp's (lower case) and ``"segnet"``."""
    return [*smp.MODEL_ARCHITECTURES_MAPPING, "segnet"]


class SegmentationNet(nn.Module):
    """Encoder -> decoder -> segmentation head, and the shape node on the deepest encoder features.

    ``encoder(x)`` returns the list of feature maps, deepest last, or ``(features, extra)`` whose
    ``extra`` the decoder also takes (SegNet: the max-pool indices; smp's DPT: the prefix tokens).
    """

    def __init__(
        self,
        encoder: nn.Module,
        decoder: nn.Module,
        segmentation_head: nn.Module,
        *,
        deepest_channels: int,
        size_multiple: int,
        in_channels: int,
        shape_scores: int = 1,
    ) -> None:
        super().__init__()
        self.encoder, self.decoder, self.segmentation_head = encoder, decoder, segmentation_head
        self.shape_head = ShapeHead(deepest_channels, shape_scores)
        self.size_multiple, self.in_channels = size_multiple, in_channels

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``x``: float ``(B, in_channels, H, W)``, any ``H, W`` -> ``(logits, u)``."""
        if not isinstance(x, Tensor) or not x.is_floating_point() or x.dim() != 4:
            raise ValueError(f"x must be a float tensor (B, C, H, W), got {_describe(x)}")
        if x.shape[1] != self.in_channels:
            raise ValueError(f"x must have {self.in_channels} channels, got {tuple(x.shape)}")
        size = x.shape[-2:]
        padded = pad_to_multiple(x, self.size_multiple)
        encoded = self.encoder(padded)  # the one encoder pass: decoder and shape node share it
        if isinstance(encoded, tuple) and isinstance(encoded[0], (list, tuple)):
            features, decoded = encoded[0], self.decoder(*encoded)
        else:
            features, decoded = encoded, self.decoder(encoded)
        logits = self.segmentation_head(decoded)
        if logits.shape[-2:] != padded.shape[-2:]:
            raise RuntimeError(
                f"the network maps a {tuple(padded.shape[-2:])} input to "
                f"{tuple(logits.shape[-2:])} logits; size_multiple={self.size_multiple} is too small"
            )
        u = self.shape_head(valid_mean(features[-1], size, padded.shape[-2:]))
        return logits[..., : size[0], : size[1]], u


def build_segmentation_model(
    arch: str,
    encoder: str,
    encoder_weights: str | None,
    num_classes: int,
    shape_scores: int = 1,
    in_channels: int = 3,
) -> SegmentationNet:
    """A segmentation network with the shape node; see the module docstring.

    Args:
        arch: an smp architecture name (``smp.MODEL_ARCHITECTURES_MAPPING``, case-insensitive,
            e.g. ``"deeplabv3plus"``) or ``"segnet"``.
        encoder: an smp encoder name (``smp.encoders.get_encoder_names()``) or ``"tu-<timm model>"``;
            must be ``"vgg16_bn"`` for SegNet.
        encoder_weights: ``None`` (random init), a pretrained-weights name (smp's, e.g.
            ``"imagenet"``; SegNet: ``"imagenet"`` = torchvision's ``VGG16_BN_Weights.IMAGENET1K_V1``)
            or the path of a ``.pth``/``.pt``/``.safetensors`` file holding the encoder's state
            dict (loaded strictly; for SegNet also torchvision's full VGG16-bn file).
        num_classes: output channels of the logits (>= 1).
        shape_scores: outputs of the shape node (>= 1): 1 for a binary shape label.
        in_channels: input channels (>= 1).
    """
    for name, value in (
        ("num_classes", num_classes), ("shape_scores", shape_scores), ("in_channels", in_channels)
    ):  # fmt: skip
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if not isinstance(arch, str) or arch.lower() not in architectures():
        raise ValueError(f"unknown arch {arch!r}; valid: {architectures()}")
    weights_file = _weights_file(encoder_weights)
    if arch.lower() == "segnet":
        if encoder != "vgg16_bn":
            raise ValueError(f"SegNet's encoder must be 'vgg16_bn', got {encoder!r}")
        return _build_segnet(encoder_weights, weights_file, num_classes, shape_scores, in_channels)
    _check_smp_encoder(encoder, None if weights_file else encoder_weights)
    model = _create_smp(arch, encoder, None if weights_file else encoder_weights, num_classes,
                        in_channels)  # fmt: skip
    if weights_file is not None:
        _load_encoder_file(model.encoder, weights_file, encoder)
    return SegmentationNet(
        model.encoder,
        model.decoder,
        model.segmentation_head,  # smp's aux classification head (aux_params=None) is not built
        deepest_channels=model.encoder.out_channels[-1],
        size_multiple=int(model.encoder.output_stride) * EXTRA_DOWNSAMPLING.get(arch.lower(), 1),
        in_channels=in_channels,
        shape_scores=shape_scores,
    )


# --- padding and pooling ------------------------------------------------------------------------


def pad_to_multiple(x: Tensor, multiple: int) -> Tensor:
    """Zero-pad ``x (..., H, W)`` at the bottom and right to multiples of ``multiple`` (no-op if so)."""
    h, w = x.shape[-2:]
    dh, dw = -h % multiple, -w % multiple
    return F.pad(x, (0, dw, 0, dh)) if dh or dw else x


def valid_mean(features: Tensor, size: tuple[int, int], padded: tuple[int, int]) -> Tensor:
    """Mean of ``features (B, C, h, w)`` over the cells that cover an ``size`` image padded to
    ``padded``: ``ceil(H h / H_padded)`` x ``ceil(W w / W_padded)`` cells (top left) -> ``(B, C)``."""
    rows = -(-size[0] * features.shape[-2] // padded[0])
    cols = -(-size[1] * features.shape[-1] // padded[1])
    return features[..., :rows, :cols].mean((-2, -1))


# --- SegNet --------------------------------------------------------------------------------------


class SegNetEncoder(nn.Module):
    """VGG16-bn's ``features`` (torchvision): 5 stages of conv-bn-relu blocks, each closed by a
    2x2 max pool that also returns its argmax indices. ``forward -> (features, indices)``:
    ``features = [x, pool1, ..., pool5]``, ``indices = [idx1, ..., idx5]``. State-dict keys are
    torchvision's (``features.0.weight``, ...), so its VGG16-bn weights load as they are."""

    def __init__(self, in_channels: int = 3) -> None:
        super().__init__()
        self.features = make_layers(vgg_cfgs["D"], batch_norm=True)
        for i, layer in enumerate(self.features):
            if isinstance(layer, nn.MaxPool2d):
                self.features[i] = nn.MaxPool2d(2, 2, return_indices=True)
        if in_channels != 3:
            first = self.features[0]
            self.features[0] = nn.Conv2d(in_channels, first.out_channels, 3, padding=1)
        self.out_channels = (in_channels, *(stage[-1] for stage in VGG16_STAGES))
        _init_vgg_style(self)

    def forward(self, x: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        features, indices = [x], []
        for layer in self.features:
            if isinstance(layer, nn.MaxPool2d):
                x, idx = layer(x)
                features.append(x)
                indices.append(idx)
            else:
                x = layer(x)
        return features, indices


class SegNetDecoder(nn.Module):
    """The encoder mirrored: per stage (deepest first) a 2x2 max-unpool that puts each value back
    at its pooling argmax, then as many conv-bn-relu blocks as the encoder stage has; the last
    block of a stage narrows to the width of the stage above. Output: 64 channels at full size."""

    def __init__(self) -> None:
        super().__init__()
        blocks = []
        for s in reversed(range(len(VGG16_STAGES))):
            widths = VGG16_STAGES[s]
            outs = [*widths[:-1], VGG16_STAGES[s - 1][-1] if s else widths[-1]]
            layers: list[nn.Module] = []
            for c_in, c_out in zip([widths[-1], *outs[:-1]], outs, strict=True):
                layers += [nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU()]
            blocks.append(nn.Sequential(*layers))
        self.unpool = nn.MaxUnpool2d(2, 2)
        self.blocks = nn.ModuleList(blocks)
        _init_vgg_style(self)

    def forward(self, features: list[Tensor], indices: list[Tensor]) -> Tensor:
        x = features[-1]
        for block, idx, above in zip(
            self.blocks, reversed(indices), reversed(features[:-1]), strict=True
        ):
            x = block(self.unpool(x, idx, output_size=above.shape[-2:]))
        return x


def _init_vgg_style(module: nn.Module) -> None:  # torchvision's VGG init (He, fan-out)
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            nn.init.zeros_(m.bias)


def _build_segnet(weights, weights_file, num_classes, shape_scores, in_channels) -> SegmentationNet:
    if weights is not None and weights_file is None and weights != "imagenet":
        raise ValueError(
            f"SegNet's encoder_weights must be None, 'imagenet' or a weights file, got {weights!r}"
        )
    rgb = None  # torchvision's 3-channel VGG16-bn weights: loaded, then adapted to in_channels
    if weights_file is None:
        encoder = SegNetEncoder(in_channels)
        if weights == "imagenet":
            rgb = _torchvision_state_dict(VGG16_BN_Weights.IMAGENET1K_V1)
    else:
        state = _read_state_dict(weights_file)
        if any(k.startswith("classifier.") for k in state):  # torchvision's full VGG16-bn file
            rgb = state
        else:  # the encoder's own state dict, as built
            encoder = SegNetEncoder(in_channels)
            _load_encoder_file(encoder, weights_file, "vgg16_bn", state)
    if rgb is not None:
        encoder = SegNetEncoder(3)
        features = {k: v for k, v in rgb.items() if k.startswith("features.")}
        _load_encoder_file(encoder, weights_file or "imagenet", "vgg16_bn", features)
        if in_channels != 3:
            _adapt_first_conv(encoder, in_channels)
    return SegmentationNet(
        encoder,
        SegNetDecoder(),
        nn.Conv2d(64, num_classes, 3, padding=1),
        deepest_channels=encoder.out_channels[-1],
        size_multiple=SEGNET_MULTIPLE,
        in_channels=in_channels,
        shape_scores=shape_scores,
    )


@torch.no_grad()
def _adapt_first_conv(encoder: SegNetEncoder, in_channels: int) -> None:
    """RGB filters -> ``in_channels`` filters: fewer channels sum the RGB filters they stand for,
    more cycle through R, G, B scaled by ``3 / in_channels`` (same response to a gray image)."""
    old = encoder.features[0]
    w = old.weight
    if in_channels < 3:
        new_w = torch.stack([w[:, i::in_channels].sum(1) for i in range(in_channels)], 1)
    else:
        new_w = w[:, [i % 3 for i in range(in_channels)]] * (3 / in_channels)
    conv = nn.Conv2d(in_channels, old.out_channels, 3, padding=1)
    conv.weight.copy_(new_w)
    conv.bias.copy_(old.bias)
    encoder.features[0] = conv
    encoder.out_channels = (in_channels, *encoder.out_channels[1:])


# --- smp -----------------------------------------------------------------------------------------


def _check_smp_encoder(encoder: str, weights: str | None) -> None:
    names = smp.encoders.get_encoder_names()
    if isinstance(encoder, str) and encoder.startswith("tu-"):
        if not timm.is_model(encoder[3:]):
            close = difflib.get_close_matches(encoder[3:], timm.list_models(), n=5)
            raise ValueError(
                f"unknown timm encoder {encoder!r}: timm has no model {encoder[3:]!r}"
                f" (close: {close}; all: timm.list_models())"
            )
        return
    if encoder not in names:
        close = difflib.get_close_matches(str(encoder), names, n=5)
        raise ValueError(
            f"unknown encoder {encoder!r} (close: {close}); valid: 'tu-<timm model name>' or one "
            f"of {names}"
        )
    available = list(smp.encoders.encoders[encoder]["pretrained_settings"])
    if weights is not None and weights not in available:
        raise ValueError(
            f"encoder_weights {weights!r} does not exist for encoder {encoder!r}: use None, one of "
            f"{available} or a {'/'.join(WEIGHT_FILE_SUFFIXES)} file"
        )


def _create_smp(arch, encoder, weights, num_classes, in_channels) -> nn.Module:
    """``smp.create_model``; with weights to fetch and no route to the Hugging Face Hub, the hub
    client runs in offline mode (cached files load, missing ones fail at once, no retries)."""
    what = f"{weights!r} of encoder {encoder!r}"
    if weights is not None and encoder.startswith("tu-"):
        weights = True  # timm picks the weights by the name's tag; smp wants True, not a name
    offline = weights is not None and not _reachable(hf_constants.ENDPOINT)
    try:
        with _hub_offline(offline):
            return smp.create_model(arch, encoder_name=encoder, encoder_weights=weights,
                                    in_channels=in_channels, classes=num_classes,
                                    **SMP_KWARGS.get(arch.lower(), {}))  # fmt: skip
    except (OSError, HfHubHTTPError) as e:
        if weights is None:
            raise
        raise RuntimeError(_download_help(what, e, offline)) from e


@contextlib.contextmanager
def _hub_offline(offline: bool):
    old = hf_constants.HF_HUB_OFFLINE  # read by huggingface_hub.is_offline_mode() at each call
    hf_constants.HF_HUB_OFFLINE = old or offline
    try:
        yield
    finally:
        hf_constants.HF_HUB_OFFLINE = old


# --- weights -------------------------------------------------------------------------------------


def _weights_file(weights: object) -> Path | None:
    """The local weights file named by ``encoder_weights``, else ``None`` (a name or ``None``)."""
    if weights is None:
        return None
    if not isinstance(weights, (str, os.PathLike)):
        raise ValueError(f"encoder_weights must be None, a name or a path, got {weights!r}")
    path = Path(weights)
    if path.suffix.lower() in WEIGHT_FILE_SUFFIXES:
        if not path.is_file():
            raise ValueError(f"encoder_weights file {str(path)!r} does not exist")
        return path
    if path.is_file():
        raise ValueError(
            f"encoder_weights file {str(path)!r} must end in one of {WEIGHT_FILE_SUFFIXES}"
        )
    return None


def _read_state_dict(path: Path) -> dict[str, Tensor]:
    try:
        if path.suffix.lower() == ".safetensors":
            state = load_file(path, device="cpu")
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # corrupt or foreign file: say which one
        raise ValueError(f"could not read a state dict from {str(path)!r}: {e}") from e
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise ValueError(
            f"{str(path)!r} must hold a state dict (name -> tensor), got {type(state).__name__}"
        )
    return state


def _load_encoder_file(encoder: nn.Module, path, name: str, state=None) -> None:
    """Strict ``load_state_dict`` into the encoder; a mismatch is a ``ValueError`` naming the file."""
    state = _read_state_dict(path) if state is None else state
    try:
        encoder.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise ValueError(
            f"encoder_weights {str(path)!r} do not match the {name!r} encoder as built "
            f"(in_channels included): {e}"
        ) from e


def _torchvision_state_dict(weights: VGG16_BN_Weights) -> dict[str, Tensor]:
    """The weights' state dict from the torch hub cache, or downloaded; fails fast offline."""
    url = weights.url
    cached = Path(torch.hub.get_dir()) / "checkpoints" / Path(urllib.parse.urlsplit(url).path).name
    offline = not cached.is_file() and not _reachable(url)
    if offline:
        raise RuntimeError(_download_help(f"torchvision {weights}", f"{url} unreachable", True))
    try:
        return weights.get_state_dict(progress=False)
    except OSError as e:  # urllib's URLError / HTTPError included
        raise RuntimeError(_download_help(f"torchvision {weights}", e, False)) from e


def _reachable(url: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a TCP connection to ``url``'s host (or the HTTPS proxy in the environment) opens
    within ``timeout`` seconds, name lookup included (in a thread: lookups ignore timeouts)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    proxy = urllib.request.getproxies().get(parts.scheme)
    if proxy and not urllib.request.proxy_bypass(host):
        parts = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    result: list[bool] = []
    done = threading.Event()

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout).close()
            result.append(True)
        except OSError:
            pass
        done.set()

    threading.Thread(target=connect, daemon=True).start()
    return done.wait(timeout) and bool(result)


def _download_help(what: str, cause: object, offline: bool) -> str:
    reason = "no network route to the server" if offline else "the download failed"
    return (
        f"could not get the pretrained weights {what}: {reason} ({cause}). To fix: train from "
        "scratch with model.encoder_weights=null; or, on a machine with internet, build the model "
        "once to fill the caches and copy them here (smp and timm weights: the Hugging Face cache, "
        "$HF_HOME/hub, default ~/.cache/huggingface/hub; torchvision weights: "
        "$TORCH_HOME/hub/checkpoints, default ~/.cache/torch/hub/checkpoints), set HF_HOME / "
        "TORCH_HOME to where they are and HF_HUB_OFFLINE=1; or pass the path of a local "
        f"{'/'.join(WEIGHT_FILE_SUFFIXES)} file with the encoder's state dict as encoder_weights."
    )


def _describe(x: object) -> str:
    if isinstance(x, Tensor):
        return f"tensor of dtype {x.dtype} and shape {tuple(x.shape)}"
    return type(x).__name__


__all__ = [
    "SegNetDecoder",
    "SegNetEncoder",
    "SegmentationNet",
    "architectures",
    "build_segmentation_model",
    "pad_to_multiple",
    "valid_mean",
]
