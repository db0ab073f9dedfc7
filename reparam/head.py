"""``ShapeHead``: the paper's "extra node", a linear layer on any representation."""

from __future__ import annotations

from torch import Tensor, nn


class ShapeHead(nn.Module):
    """The paper's "extra node": ``u = w . pool(a) + b`` from any representation ``a``.

    ``a`` of shape ``(B, C)`` or a feature map ``(B, C, ...)`` (globally average-pooled). Returns
    ``(B,)`` for ``num_scores = 1``, else ``(B, num_scores)``.

    Args:
        in_features: ``C``, the representation's channels (``>= 1``).
        num_scores: the scores per sample (``>= 1``): one per positive class of the objective.

    Examples:
        >>> import torch
        >>> from reparam import ShapeHead
        >>> head = ShapeHead(8)
        >>> head(torch.ones(4, 8)).shape
        torch.Size([4])
        >>> ShapeHead(8, num_scores=3)(torch.ones(4, 8, 5, 5)).shape  # a pooled feature map
        torch.Size([4, 3])
    """

    def __init__(self, in_features: int, num_scores: int = 1) -> None:
        super().__init__()
        if in_features < 1 or num_scores < 1:
            raise ValueError(
                f"in_features and num_scores must be >= 1, got {in_features} and {num_scores}"
            )
        self.num_scores = num_scores
        self.linear = nn.Linear(in_features, num_scores)

    def forward(self, features: Tensor) -> Tensor:
        if features.dim() > 2:
            features = features.flatten(2).mean(-1)
        if features.dim() != 2 or features.shape[1] != self.linear.in_features:
            raise ValueError(
                f"features must have shape (B, {self.linear.in_features}) or "
                f"(B, {self.linear.in_features}, ...), got {tuple(features.shape)}"
            )
        out = self.linear(features)
        return out.squeeze(-1) if self.num_scores == 1 else out
