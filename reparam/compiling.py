"""The regularizer's step under ``torch.compile`` (``ReparamRegularizer.compile``, method note
sec. 11b): the forward and ``after_step_`` compiled once per regularizer, each with a code object
and a name of its own."""

from __future__ import annotations

import itertools
import types
from collections.abc import Callable

import torch


def compiled_steps(cls: type, **options: object) -> tuple[Callable, Callable]:
    """``torch.compile(**options)`` of ``cls._forward`` and ``cls._after_step``, each called with
    the regularizer as its first argument (``ShapeObjective._dispatch``)."""
    return (
        torch.compile(_own_code(cls._forward), **options),
        torch.compile(_own_code(cls._after_step), **options),
    )


def _own_code(fn):
    """The function ``fn`` (undecorated: ``torch.no_grad`` is applied by the caller) with a code
    object of its own, called with the regularizer as its first argument, and a name of its own
    (``_forward#3``). Dynamo keeps compiled graphs per code object with one recompile limit (8),
    and wraps a bound method in one shared function: with either, every regularizer compiled in a
    process would recompile the same code, and the ninth would fail (``fullgraph``). It also keeps
    its record of the sizes a frame has seen (which dimensions it compiles as dynamic) per
    ``(file, line, name)``: with a shared name, a regularizer's first compile would start from the
    sizes other regularizers of the process saw, so what it compiles would depend on what ran
    before it (and a dynamic first compile of ``_after_step`` fails in torch 2.13's guard builder,
    method note sec. 11b). The name makes each regularizer's compile depend on its own inputs
    only."""
    fn = getattr(fn, "__wrapped__", fn)
    name = f"{fn.__name__}#{next(_COMPILED)}"
    code = fn.__code__.replace(co_name=name, co_qualname=name)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


_COMPILED = itertools.count()  # one name per compiled function (_own_code)
