"""SegNet, which segmentation-models-pytorch does not have: VGG16-bn encoder, mirrored decoder.

The encoder is torchvision's VGG16-bn ``features`` (its state-dict keys, so torchvision's ImageNet
weights load as they are) with max pools that return their argmax indices; the decoder unpools
with those indices, stage by stage, deepest first. Inputs must be multiples of ``SEGNET_MULTIPLE``
(``SegmentationNet`` pads them). With ``in_channels != 3`` the RGB weights' first convolution is
adapted (:func:`_adapt_first_conv`). ``build_segnet`` returns the encoder (weights loaded), the
decoder and the head; ``train.seg_models`` wraps them with the shape node.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn
from torchvision.models import VGG16_BN_Weights
from torchvision.models.vgg import cfgs as vgg_cfgs
from torchvision.models.vgg import make_layers

from .weights import _load_encoder_file, _read_state_dict, _torchvision_state_dict

SEGNET_MULTIPLE = 32  # five 2x2 max pools
VGG16_STAGES = ((64, 64), (128, 128), (256, 256, 256), (512, 512, 512), (512, 512, 512))  # "D"


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


def build_segnet(
    weights: str | None, weights_file: Path | None, num_classes: int, in_channels: int
) -> tuple[SegNetEncoder, SegNetDecoder, nn.Conv2d]:
    """``(encoder, decoder, segmentation head)``, built in this order (the same seed gives the
    same weights); ``weights``: ``None``, ``"imagenet"`` (torchvision's) or a weights file
    (``weights_file``: torchvision's full VGG16-bn file or the encoder's own state dict)."""
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
    return encoder, SegNetDecoder(), nn.Conv2d(64, num_classes, 3, padding=1)


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
