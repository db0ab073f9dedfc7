"""Models: the paper's linear S-MNIST classifier and an MLP, each with the shape node.

``forward(x) -> (logits (B, 10), u (B,))``: ``u`` is the regularizer's score (the paper's extra
node, ``reparam.ShapeHead``), read from the same forward pass: from the representation the
classifier reads (``shape_input="features"``: the pixels for ``linear``, the last hidden layer for
``mlp``) or from the class logits (``"logits"``).

Note for ``linear`` + ``"features"`` (the paper's one linear layer with 11 outputs): the shape node
shares no parameter with the 10 class outputs, so the regularizer's gradient on the classifier is
exactly zero and the class predictions equal the baseline's (tested). It can change the classifier
only through a shared representation (``mlp``) or ``shape_input="logits"``.
"""

from __future__ import annotations

import math

from torch import Tensor, nn

from reparam import ShapeHead

from .config import ModelConfig


class SMNISTNet(nn.Module):
    def __init__(self, image_shape: tuple[int, int], num_classes: int, cfg: ModelConfig) -> None:
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
        self.shape_head = ShapeHead(width if cfg.shape_input == "features" else num_classes)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``x``: uint8 images ``(B, H, W)`` (scaled to [0, 1] here) or float."""
        if not x.is_floating_point():
            x = x.float().div_(255.0)
        features = self.body(x)
        logits = self.classifier(features)
        u = self.shape_head(features if self.shape_input == "features" else logits)
        return logits, u


def build_model(cfg: ModelConfig, image_shape: tuple[int, int], num_classes: int) -> nn.Module:
    return SMNISTNet(image_shape, num_classes, cfg)
