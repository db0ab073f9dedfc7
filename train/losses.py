r"""The segmentation task loss: cross-entropy, or a loss of ``segmentation_models_pytorch.losses``
(smp) plus a weighted cross-entropy, with optional class weights from the training labels' pixel
counts (``train.loss``, ``train.loss_ce_weight``, ``train.loss_per_image``, ``train.class_weights``;
docs/segmentation/losses.md).

For logits ``z`` ``(B, C, H, W)`` and pixel labels ``y`` (255 = unlabelled, never counted)::

    task(z, y) = L(z, y) + loss_ce_weight * CE_w(z, y)         (train.loss != cross_entropy)
    task(z, y) = CE_w(z, y)                                    (train.loss == cross_entropy)

``L`` is smp's ``DiceLoss`` / ``JaccardLoss`` / ``TverskyLoss`` / ``FocalLoss`` / ``LovaszLoss`` in
``mode="multiclass"`` with ``ignore_index=255`` and smp's defaults (Tversky's ``alpha = beta = 0.5``
make it the Dice loss; smp's multiclass focal loss is the mean over the classes of the one-vs-rest
*sigmoid* focal loss, ``gamma = 2``, no ``alpha``). ``CE_w`` is torch's weighted cross-entropy mean
``sum_i w_{y_i} l_i / sum_i w_{y_i}`` over the labelled pixels ``i`` (``w = 1``: the plain mean),
0 for a batch whose labelled pixels weigh nothing. The class weights ``w`` (:func:`class_weights`)
also go to the smp losses that take ``class_weights`` (all of the above but Lovász), which average
their per-class terms as ``sum_c w_c L_c / sum_c w_c``.

The default (``cross_entropy`` without class weights) is not built here: the loop keeps its own
cross-entropy (``task_loss``), bit for bit the loss of the runs before these options.

The loss math is smp's and torch's; this module only picks, weighs and guards it. smp is imported
lazily (after the torchvision import cure), so the config can read the option tuples cheaply.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .caches import segmentation

if TYPE_CHECKING:
    from .config import Config
    from .data import DataBundle
    from .groups import GroupWeighting

IGNORE_INDEX = segmentation.IGNORE  # = train.data.IGNORE_INDEX (255)
# train.loss: cross-entropy, or the smp loss of that name (segmentation only)
TASK_LOSSES = ("cross_entropy", "dice", "lovasz", "focal", "jaccard", "tversky")
CLASS_WEIGHT_RULES = ("none", "median_frequency", "inverse_sqrt")  # train.class_weights
PER_IMAGE_LOSSES = ("lovasz",)  # the smp losses with a ``per_image`` option
CLASS_WEIGHTED_LOSSES = ("cross_entropy", "dice", "focal", "jaccard", "tversky")  # take weights


# --- class weights: plain functions of the (N, C) pixel counts ------------------------------------


def class_pixel_counts(fractions: np.ndarray, image_size: Sequence[int]) -> np.ndarray:
    """Pixels of class ``c`` in image ``i``, ``(N, C)`` int64, from the cache's ``fractions.npy``
    (``f_ic`` = pixels of ``c`` / ``(H W)``, float32): ``rint(f_ic H W)``, exact for
    ``H W < 2^23`` (float32 rounds ``f_ic`` by a relative ``2^-24`` at most, so the product is
    off by less than ``count / 2^24 < 1/2``); a larger image is a ``ValueError``."""
    h, w = image_size
    if h * w >= 2**23:
        raise ValueError(
            f"image_size {h}x{w}: pixel counts from float32 fractions are exact only below 2^23 "
            "pixels per image"
        )
    return np.rint(np.asarray(fractions, dtype=np.float64) * (h * w)).astype(np.int64)


def median_frequency_weights(counts: np.ndarray) -> np.ndarray:
    r"""Median-frequency balancing (Eigen & Fergus, ICCV 2015; SegNet's class weights) from the
    pixel counts ``n_ic`` ``(N, C)``:

    .. math::
        \mathrm{freq}_c = \frac{\sum_i n_{ic}}{\sum_{i:\, n_{ic} > 0} \sum_k n_{ik}}, \qquad
        w_c = \frac{\operatorname{median}_{c'} \mathrm{freq}_{c'}}{\mathrm{freq}_c},

    the pixels of ``c`` over the labelled pixels of the images where ``c`` is present; the median
    (numpy's: the mean of the two middle values for an even count) is over the classes with
    training pixels. A class without training pixels gets ``w_c = 0`` (it is never a target).
    Returns float64 ``(C,)``."""
    counts = np.asarray(counts, dtype=np.int64)
    pixels = counts.sum(0)
    # labelled pixels of the images where c is present (exact integer sums)
    seen = (counts > 0).astype(np.int64).T @ counts.sum(1)
    has = pixels > 0
    freq = np.divide(pixels, seen, out=np.zeros(len(pixels)), where=has)
    return np.divide(np.median(freq[has]), freq, out=np.zeros(len(pixels)), where=has)


def inverse_sqrt_weights(counts: np.ndarray) -> np.ndarray:
    r"""Inverse square-root frequency weights from the pixel counts ``n_ic`` ``(N, C)``: with
    ``p_c = sum_i n_ic / sum_{i,k} n_ik`` (the share of the labelled training pixels),

    .. math::
        w_c = \frac{p_c^{-1/2}}{\sum_k p_k^{1/2}}, \qquad \text{so} \quad \sum_c p_c w_c = 1:

    the mean weight of a labelled training pixel is 1 (a uniform labelling gives ``w = 1``). A class
    without training pixels gets ``w_c = 0``. Returns float64 ``(C,)``."""
    pixels = np.asarray(counts, dtype=np.int64).sum(0)
    p = pixels / pixels.sum()
    root = np.sqrt(p)
    return np.divide(1.0, root * root.sum(), out=np.zeros(len(p)), where=p > 0)


def class_weights(rule: str, counts: np.ndarray) -> np.ndarray | None:
    """``train.class_weights`` for the pixel counts ``counts`` ``(N, C)``: ``None`` for ``"none"``,
    else :func:`median_frequency_weights` or :func:`inverse_sqrt_weights`. ``ValueError`` when
    the counts hold no labelled pixel."""
    if rule not in CLASS_WEIGHT_RULES:
        raise ValueError(f"rule must be one of {CLASS_WEIGHT_RULES}, got {rule!r}")
    if rule == "none":
        return None
    if not np.asarray(counts).sum() > 0:
        raise ValueError(
            f"class weights {rule!r}: the training labels hold no labelled pixel "
            f"(counts of shape {np.shape(counts)})"
        )
    return (median_frequency_weights if rule == "median_frequency" else inverse_sqrt_weights)(
        counts
    )


def training_class_weights(cfg: Config, data: DataBundle) -> Tensor | None:
    """The class weights of ``cfg.train.class_weights`` from the cache's training ``fractions``
    (the first ``len(data.train)`` images: ``data.train_subset`` is respected), float32 ``(C,)``."""
    if cfg.train.class_weights == "none":
        return None
    splits, meta = segmentation.load(cfg.data.path)
    counts = class_pixel_counts(splits["train"]["fractions"][: len(data.train)], meta["image_size"])
    return torch.from_numpy(class_weights(cfg.train.class_weights, counts)).float()


# --- the loss module ------------------------------------------------------------------------------


class TaskLoss(nn.Module):
    """``loss(logits, y) = L(logits, y) + ce_weight * CE_w(logits, y)`` (module docstring) for
    logits ``(B, C, H, W)`` and labels ``(B, H, W)`` with ``IGNORE_INDEX`` for unlabelled pixels.

    Args:
        loss: one of ``TASK_LOSSES``; ``"cross_entropy"``: ``CE_w`` alone.
        num_classes: ``C`` (>= 2).
        ce_weight: weight of the cross-entropy term (>= 0; must be 0 for ``"cross_entropy"``).
        per_image: Lovász only: the loss of each image, averaged over the batch's images that have
            a labelled pixel (smp's ``per_image``); ``False``: one loss over the batch's pixels.
        class_weights: ``(C,)`` non-negative weights for ``CE_w`` and the smp losses that take
            them (``CLASS_WEIGHTED_LOSSES``); ``None``: unweighted.

    Computed in float32 with autocast off (smp's Lovász would otherwise take a bf16 ``dot``).
    """

    def __init__(
        self,
        loss: str,
        num_classes: int,
        ce_weight: float = 0.0,
        per_image: bool = False,
        class_weights: Tensor | Sequence[float] | None = None,
    ) -> None:
        super().__init__()
        if loss not in TASK_LOSSES:
            raise ValueError(f"loss must be one of {TASK_LOSSES}, got {loss!r}")
        if num_classes < 2:
            raise ValueError(f"num_classes must be >= 2 (multiclass logits), got {num_classes}")
        if not (np.isfinite(ce_weight) and ce_weight >= 0):
            raise ValueError(f"ce_weight must be a finite number >= 0, got {ce_weight!r}")
        if loss == "cross_entropy" and ce_weight != 0:
            raise ValueError(
                f"ce_weight applies to a loss other than cross_entropy, got {ce_weight}"
            )
        if per_image and loss not in PER_IMAGE_LOSSES:
            raise ValueError(f"per_image applies to {PER_IMAGE_LOSSES} only, got loss={loss!r}")
        weights = None
        if class_weights is not None:
            weights = torch.as_tensor(class_weights, dtype=torch.float32).detach().clone()
            if weights.shape != (num_classes,) or not (weights >= 0).all() or weights.isinf().any():
                raise ValueError(
                    f"class_weights must be {num_classes} finite numbers >= 0, got {weights}"
                )
            if loss not in CLASS_WEIGHTED_LOSSES and ce_weight == 0:
                raise ValueError(
                    f"class_weights with loss={loss!r} need ce_weight > 0: smp's {loss} takes "
                    "no class weights, they weigh the cross-entropy term only"
                )
        self.loss, self.num_classes, self.ce_weight = loss, num_classes, float(ce_weight)
        self.per_image = per_image
        self.register_buffer("class_weights", weights)
        self.smp = None if loss == "cross_entropy" else self._build_smp(weights)

    def _build_smp(self, weights: Tensor | None) -> nn.Module:
        from .torchvision_compat import ensure_torchvision_importable

        ensure_torchvision_importable()  # before smp (and the timm / torchvision it imports)
        from segmentation_models_pytorch import losses

        kwargs = {"mode": losses.MULTICLASS_MODE, "ignore_index": IGNORE_INDEX}
        if self.loss == "lovasz":
            return losses.LovaszLoss(per_image=self.per_image, **kwargs)
        if weights is not None:
            kwargs["class_weights"] = weights.tolist()  # smp keeps them as a tensor of its own
        cls = {
            "dice": losses.DiceLoss,
            "jaccard": losses.JaccardLoss,
            "tversky": losses.TverskyLoss,
            "focal": losses.FocalLoss,
        }[self.loss]
        return cls(**kwargs)

    def extra_repr(self) -> str:
        weighted = "none" if self.class_weights is None else "yes"
        return (
            f"loss={self.loss}, ce_weight={self.ce_weight:g}, per_image={self.per_image}, "
            f"class_weights={weighted}"
        )

    def forward(self, logits: Tensor, y: Tensor) -> Tensor:
        with torch.autocast(logits.device.type, enabled=False):
            logits, y = logits.float(), y.long()
            if self.smp is None:
                return self.cross_entropy(logits, y)
            out = self._smp_term(logits, y)
            if self.ce_weight:
                out = out + self.ce_weight * self.cross_entropy(logits, y)
            return out

    def cross_entropy(self, logits: Tensor, y: Tensor) -> Tensor:
        """``CE_w``: ``sum_i w_{y_i} l_i / sum_i w_{y_i}`` over the labelled pixels (torch's
        ``weight=`` mean); 0, not NaN, when that denominator is 0 (no labelled pixel, or only
        classes of weight 0). No host read."""
        w = self.class_weights
        total = F.cross_entropy(logits, y, weight=w, ignore_index=IGNORE_INDEX, reduction="sum")
        valid = y != IGNORE_INDEX
        if w is None:
            return total / valid.sum().clamp_min(1)
        pixel_weights = torch.where(valid, w[y.masked_fill(~valid, 0)], 0.0)
        return total / pixel_weights.sum().clamp_min(torch.finfo(total.dtype).tiny)

    def _smp_term(self, logits: Tensor, y: Tensor) -> Tensor:
        # smp 0.6.0 leaves ignored pixels out of every loss here (Dice / Jaccard / Tversky zero
        # their probabilities and one-hot targets; focal and Lovász drop them by boolean indexing,
        # so they are not in focal's mean either), but two of them break on images without a
        # labelled pixel: FocalLoss's mean over no pixel is NaN (_focal, which replaces its class
        # loop, returns 0 there), and Lovász returns an empty (0, C) tensor instead of a scalar, so
        # with per_image one such image empties the whole batch's loss (or raises "output with
        # shape [] doesn't match the broadcast shape [0, C]"). Such images hold nothing that
        # counts: Lovász gets the batch without them (the other images' value is unchanged;
        # per_image averages over the images with a labelled pixel), and a batch without a
        # labelled pixel gives 0, as the cross-entropy does. One host read per step; Lovász's
        # boolean indexing reads the host anyway.
        if self.loss == "focal":
            return self._focal(logits, y)
        if self.loss == "lovasz":
            labelled = (y != IGNORE_INDEX).flatten(1).any(1)
            if not bool(labelled.all()):
                if not bool(labelled.any()):
                    return logits.sum() * 0.0
                logits, y = logits[labelled], y[labelled]
        return self.smp(logits, y)

    def _focal(self, logits: Tensor, y: Tensor) -> Tensor:
        """smp's ``FocalLoss`` (multiclass) in one call instead of one per class: its own
        ``focal_loss_fn`` (smp 0.6.0: ``focal_loss_with_logits`` with its ``gamma``, ``alpha``)
        on the labelled pixels' logits ``(P, C)`` against their one-hot targets, averaged over
        the pixels, then over the classes as ``FocalLoss`` does (``sum_c w_c L_c / sum_c w_c``
        with class weights). ``FocalLoss`` slices ``y_pred[:, c]`` per class, and each slice
        back-propagates a zero-filled gradient of the full logits: O(C^2 B H W) (92 classes,
        8 x 106 x 160, 2 CPU threads, forward + backward: 2.0 s, here 0.4 s;
        ``python -m benchmarks.task_losses``). Same value and gradient up to the float order of
        the sums (tests/train/test_losses.py)."""
        valid = y != IGNORE_INDEX
        z = logits.movedim(1, -1)[valid]  # (P, C): the labelled pixels only
        if z.shape[0] == 0:  # known on the host after the boolean indexing
            return logits.sum() * 0.0
        target = F.one_hot(y[valid], self.num_classes)
        per_class = self.smp.focal_loss_fn(z, target, reduction="none").mean(0)
        w = self.smp.class_weights
        if w is None:
            return per_class.mean()
        w = w.to(per_class.device)
        return (per_class * w).sum() / w.sum()


def build_task_loss(cfg: Config, data: DataBundle) -> TaskLoss | None:
    """The task loss of ``cfg.train`` for ``data`` (class weights from its training cache);
    ``None`` for the default, plain cross-entropy, which ``task_loss`` computes."""
    t = cfg.train
    if t.loss == "cross_entropy" and t.class_weights == "none":
        return None
    return TaskLoss(
        t.loss,
        data.num_classes,
        ce_weight=t.loss_ce_weight,
        per_image=t.loss_per_image,
        class_weights=training_class_weights(cfg, data),
    )


def validate_task_loss(cfg: Config) -> None:
    """``train.loss``, ``loss_ce_weight``, ``loss_per_image``, ``class_weights``: a setting that
    would be ignored, or that the data or ``train.group_weighting`` cannot take, is an error."""
    t = cfg.train
    if not (math.isfinite(t.loss_ce_weight) and t.loss_ce_weight >= 0):
        raise ValueError(
            f"train.loss_ce_weight must be a finite number >= 0, got {t.loss_ce_weight!r}"
        )
    if t.loss == "cross_entropy" and t.loss_ce_weight != 0:
        raise ValueError(
            f"train.loss_ce_weight={t.loss_ce_weight!r} applies only with another train.loss (the "
            "task loss is train.loss + train.loss_ce_weight * cross-entropy); with "
            "train.loss=cross_entropy leave it at 0"
        )
    if t.loss_per_image and t.loss not in PER_IMAGE_LOSSES:
        raise ValueError(
            f"train.loss_per_image=true applies only to train.loss in {PER_IMAGE_LOSSES} (smp's "
            f"per_image), got train.loss={t.loss!r}; leave it false"
        )
    if not cfg.data.segmentation:
        for key, value, default in (
            ("loss", t.loss, "cross_entropy"),
            ("class_weights", t.class_weights, "none"),
        ):
            if value != default:
                raise ValueError(
                    f"train.{key}={value!r} is for segmentation; data.kind {cfg.data.kind!r} "
                    f"trains with train.{key}={default!r}"
                )
    if t.class_weights != "none" and t.loss not in CLASS_WEIGHTED_LOSSES and t.loss_ce_weight == 0:
        raise ValueError(
            f"train.class_weights={t.class_weights!r} with train.loss={t.loss!r} needs "
            f"train.loss_ce_weight > 0: smp's {t.loss} loss takes no class weights, so they "
            "would weigh nothing (they weigh the cross-entropy term)"
        )
    if t.group_weighting != "none" and (t.loss != "cross_entropy" or t.class_weights != "none"):
        raise ValueError(
            f"train.group_weighting={t.group_weighting!r} reweights the per-pixel cross-entropy "
            "terms: it needs train.loss='cross_entropy' and train.class_weights='none', got "
            f"train.loss={t.loss!r}, train.class_weights={t.class_weights!r}"
        )


def task_loss(
    logits: Tensor,
    y: Tensor,
    groups: GroupWeighting | None = None,
    shape: Tensor | None = None,
    criterion: TaskLoss | None = None,
) -> Tensor:
    """Cross-entropy; pixels labelled ``IGNORE_INDEX`` do not count (a batch with no labelled
    pixel gives 0, not NaN). With ``groups`` (``train.group_weighting``), the per-pixel (per-sample)
    terms weighted over the samples' shape groups ``shape`` (train/groups.py). With ``criterion``
    (``train.loss`` / ``train.class_weights`` set, train/losses.py), that loss instead."""
    if criterion is not None:
        return criterion(logits, y)
    if groups is not None:
        per_term = F.cross_entropy(logits, y, ignore_index=IGNORE_INDEX, reduction="none")
        return groups.loss(per_term, shape, y != IGNORE_INDEX if logits.dim() > 2 else None)
    if logits.dim() == 2:
        return F.cross_entropy(logits, y)
    total = F.cross_entropy(logits, y, ignore_index=IGNORE_INDEX, reduction="sum")
    return total / (y != IGNORE_INDEX).sum().clamp_min(1)
