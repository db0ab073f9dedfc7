"""The paper's "full projections" comparison (method note sec. 3b): F-beta with a dense ``tau``
projected onto ``C`` after every optimizer step, O(n) per step.

The paper contrasts its once-per-epoch projection (Algorithm 3) with projecting after every step.
The library's schedules are once per epoch (``EpochEnd()``), inside the loss (``Inline()``) and
the tracked threshold (``Tracked()``, the default); this class keeps the
per-step projection for reproducing that comparison (``benchmarks.smnist_results``).
"""

from __future__ import annotations

from typing import Any

from ..fbeta import PAPER, FBetaRegularizer
from ..options import DenseTau, EpochEnd
from ..schedules import Schedule


class EveryStep(Schedule):
    """The schedule of ``FullProjectionsFBeta``: the loss takes the raw parameters, which the
    projection after every step keeps in ``C`` (nothing is left to project at the epoch end); the
    exact projection reads values, so the step does not trace whole."""

    name = "every_step"
    traces_whole = False


class FullProjectionsFBeta(FBetaRegularizer):
    """``FBetaRegularizer`` projecting ``(eps, tau)`` onto ``C`` after every optimizer step.

    A dense ``tau``; ``(eps, tau)`` are projected in place in ``after_step_``; the epoch end takes
    the dual step on them (they are in ``C`` already).

    Args:
        shape_labels: as for ``reparam.FBetaRegularizer``.
        **options: the options of ``reparam.FBetaRegularizer`` but ``schedule`` and ``tau``,
            which this schedule fixes (``FullProjectionsFBeta.paper``: the paper's steps).

    Examples:
        >>> import torch
        >>> from reparam.baselines import FullProjectionsFBeta
        >>> reg = FullProjectionsFBeta(torch.tensor([0, 1, 1, 0, 1]))
        >>> scores = torch.tensor([0.2, 0.9], requires_grad=True)  # samples 0 and 2
        >>> opt = torch.optim.SGD([scores, *reg.parameters()], lr=0.1)
        >>> reg(scores, torch.tensor([0, 2])).backward(); opt.step(); reg.after_step_()
        >>> int(reg.projections), bool((reg.tau <= reg.eps).all())  # projected onto C
        (1, True)
    """

    _fixed_options = ("schedule", "tau")

    def __init__(self, shape_labels: object, **options: Any) -> None:
        fixed = sorted(set(options) & set(self._fixed_options))
        if fixed:
            raise ValueError(
                f"FullProjectionsFBeta fixes {', '.join(fixed)} (a dense tau projected after every "
                f"step), got {', '.join(f'{k}={options[k]!r}' for k in fixed)}"
            )
        super().__init__(shape_labels, schedule=EpochEnd(), tau=DenseTau(), **options)
        self.schedule = EveryStep()

    @classmethod
    def paper(cls, shape_labels: object, **options: Any) -> FullProjectionsFBeta:
        """The full projections with the paper's dual steps and uncapped scores.

        Those of ``FBetaRegularizer.paper``, projected after every step; ``options`` override
        them."""
        fixed = {k: v for k, v in PAPER.items() if k not in cls._fixed_options}
        return cls(shape_labels, **(fixed | options))

    @property
    def _needs_after_step(self) -> str | None:
        return "FullProjectionsFBeta projects there, so nothing is projected"

    def _after_step_body_(self) -> None:
        """Project ``(eps, tau)`` onto ``C`` in place (counted in ``stats()["projections"]``)."""
        self.project_()

    def extra_repr(self) -> str:
        return super().extra_repr() + ", full projections after every step"
