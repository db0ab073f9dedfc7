"""Segmentation models for COCO-Stuff, each with the paper's shape node.

``forward(x) -> (logits (B, num_classes, H, W), u)``: ``u`` is the regularizer's score, the paper's
"extra node" (``reparam.ShapeHead``): one linear layer on image-level features, here the globally
average-pooled deepest encoder features, read in the same forward pass as the logits (docs/method/shape-labels.md sec. 6:
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

The pieces: ``train.segnet`` (SegNet's encoder and decoder) and ``train.weights`` (weight files,
downloads and the reachability probe).
"""

from __future__ import annotations

import difflib

import huggingface_hub.constants as hf_constants
import segmentation_models_pytorch as smp
import timm
import torch.nn.functional as F
from huggingface_hub.errors import HfHubHTTPError
from torch import Tensor, nn

from reparam import ShapeHead

from .segnet import SEGNET_MULTIPLE, SegNetDecoder, SegNetEncoder, build_segnet
from .weights import (
    WEIGHT_FILE_SUFFIXES,
    _download_help,
    _hub_offline,
    _load_encoder_file,
    _reachable,
    _weights_file,
)

# smp architectures whose decoder downsamples the deepest encoder features further (PAN's feature
# pyramid attention: three 2x2 max pools; DPT: its deepest reassembled map is at twice the patch
# stride), then upsamples 2x to meet them: input multiple = encoder output stride x this (smp's
# own check_input_shape asks for the output stride only, and odd sizes then crash)
EXTRA_DOWNSAMPLING = {"pan": 8, "dpt": 2}
# smp keyword arguments per architecture: DPT's ViT encoder takes any size (multiple of the patch)
SMP_KWARGS: dict[str, dict] = {"dpt": {"dynamic_img_size": True}}


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
        ("num_classes", num_classes),
        ("shape_scores", shape_scores),
        ("in_channels", in_channels),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if not isinstance(arch, str) or arch.lower() not in architectures():
        raise ValueError(f"unknown arch {arch!r}; valid: {architectures()}")
    weights_file = _weights_file(encoder_weights)
    if arch.lower() == "segnet":
        if encoder != "vgg16_bn":
            raise ValueError(f"SegNet's encoder must be 'vgg16_bn', got {encoder!r}")
        parts = build_segnet(encoder_weights, weights_file, num_classes, in_channels)
        size_multiple = SEGNET_MULTIPLE
    else:
        _check_smp_encoder(encoder, None if weights_file else encoder_weights)
        model = _create_smp(
            arch, encoder, None if weights_file else encoder_weights, num_classes, in_channels
        )
        if weights_file is not None:
            _load_encoder_file(model.encoder, weights_file, encoder)
        # smp's aux classification head (aux_params=None) is not built
        parts = (model.encoder, model.decoder, model.segmentation_head)
        size_multiple = int(model.encoder.output_stride) * EXTRA_DOWNSAMPLING.get(arch.lower(), 1)
    return SegmentationNet(
        *parts,
        deepest_channels=parts[0].out_channels[-1],
        size_multiple=size_multiple,
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
            return smp.create_model(
                arch,
                encoder_name=encoder,
                encoder_weights=weights,
                in_channels=in_channels,
                classes=num_classes,
                **SMP_KWARGS.get(arch.lower(), {}),
            )
    except (OSError, HfHubHTTPError) as e:
        if weights is None:
            raise
        raise RuntimeError(_download_help(what, e, offline)) from e


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
