"""Models: the paper's linear S-MNIST classifier and an MLP, each with the shape node; the
segmentation networks (``seg_models``) behind a uint8-input wrapper.

``forward(x) -> (logits (B, 10), u (B,))``: ``u`` is the regularizer's score (the paper's extra
node, ``reparam.ShapeHead``), read from the same forward pass: from the representation the
classifier reads (``shape_input="features"``: the pixels for ``linear``, the last hidden layer for
``mlp``) or from the class logits (``"logits"``).

``model.shared_gemm: true`` (``"features"`` only) computes the class logits and the shape scores
with one matrix product of the representation with the stacked weights ``[W_cls; w_shape]`` (the
paper's single layer with 11 outputs) instead of two; the parameters, their initialization and
the ``state_dict`` keys are those of the two-layer path, which stays the default (tested equal to
rounding).

Note for ``linear`` + ``"features"`` (the paper's one linear layer with 11 outputs): the shape node
shares no parameter with the 10 class outputs, so the regularizer's gradient on the classifier is
exactly zero and the class predictions equal the baseline's (tested). It can change the classifier
only through a shared representation (``mlp``) or ``shape_input="logits"``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from reparam import ShapeHead

from .config import ModelConfig
from .torchvision_compat import ensure_torchvision_importable

IMAGENET_MEAN = (0.485, 0.456, 0.406)  # what the smp / torchvision encoders were trained with
IMAGENET_STD = (0.229, 0.224, 0.225)


class SMNISTNet(nn.Module):
    def __init__(
        self,
        image_shape: tuple[int, int],
        num_classes: int,
        cfg: ModelConfig,
        shape_scores: int = 1,
    ) -> None:
        super().__init__()
        width = math.prod(image_shape)
        layers: list[nn.Module] = [nn.Flatten()]
        if cfg.name == "mlp":
            for h in cfg.hidden:
                layers += [nn.Linear(width, h), nn.ReLU()]
                width = h
        elif cfg.name != "linear":
            raise ValueError(f"model.name must be 'linear' or 'mlp', got {cfg.name!r}")
        self.body = nn.Sequential(*layers)
        self.classifier = nn.Linear(width, num_classes)
        self.shape_input = cfg.shape_input
        in_features = width if cfg.shape_input == "features" else num_classes
        self.shape_head = ShapeHead(in_features, shape_scores)
        if cfg.shared_gemm and cfg.shape_input != "features":
            raise ValueError(
                "model.shared_gemm needs model.shape_input=features (the shape node reads the "
                f"classifier's input), got shape_input={cfg.shape_input!r}"
            )
        self.shared_gemm = cfg.shared_gemm

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``x``: uint8 images ``(B, H, W)`` (scaled to [0, 1] here) or float."""
        if not x.is_floating_point():
            x = x.float().div_(255.0)
        features = self.body(x)
        if self.shared_gemm:  # one GEMM: features @ [W_cls; w_shape]^T + [b_cls; b_shape]
            head = self.shape_head.linear
            weight = torch.cat([self.classifier.weight, head.weight])
            out = torch.addmm(torch.cat([self.classifier.bias, head.bias]), features, weight.t())
            k = self.classifier.out_features
            u = out[:, k:]
            return out[:, :k], u.squeeze(1) if self.shape_head.num_scores == 1 else u
        logits = self.classifier(features)
        u = self.shape_head(features if self.shape_input == "features" else logits)
        return logits, u


class SegmentationClassifier(nn.Module):
    """A segmentation network fed uint8 images: ``(B, 3, H, W)`` uint8 -> ImageNet-normalized
    float on the model's device (the loader ships uint8: 4x less to copy) -> ``(logits, u)``."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1) * 255)
        self.register_buffer("inv_std", 1 / (torch.tensor(IMAGENET_STD).view(1, 3, 1, 1) * 255))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        x = (x.to(self.mean.dtype) - self.mean) * self.inv_std
        return self.net(x)


def build_model(
    cfg: ModelConfig, image_shape: tuple[int, int], num_classes: int, shape_scores: int = 1
) -> nn.Module:
    """S-MNIST: ``SMNISTNet``; otherwise a segmentation network (``train.seg_models``)."""
    if cfg.name in ("linear", "mlp"):
        return SMNISTNet(image_shape, num_classes, cfg, shape_scores)
    ensure_torchvision_importable()  # before smp, timm and torchvision are imported
    from .seg_models import build_segmentation_model

    net = build_segmentation_model(
        cfg.name, cfg.encoder, cfg.encoder_weights, num_classes, shape_scores=shape_scores
    )
    return SegmentationClassifier(net)
