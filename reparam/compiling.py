"""The regularizer's step under ``torch.compile`` (method note sec. 11b).

``ReparamRegularizer.compile``: the forward and ``after_step_`` compiled once per regularizer, each
with a code object and a name of its own (``compiled_steps``).

**The forks.** Where the library's eager and compiled forms differ, it asks one of the predicates
below, and nowhere else: inside ``torch.compile``'s trace a Python value that changes is guarded
on (a recompile per change) and a read of a tensor's value breaks the graph, so the compiled form
keeps such values on the device; eager on the CPU a read costs nothing, and the eager form takes
it. Each fork is named (``FORKS``); ``compiled_forms(*names)`` makes the named forks take their
compiled form eagerly too (``benchmarks.forks`` measures what each costs that way,
``docs/figures/forks.md``).
"""

from __future__ import annotations

import contextlib
import itertools
import types
from collections.abc import Callable, Iterator

import torch

# the forks (method note sec. 11b): what each one's compiled form does instead of its eager one
FORKS = {
    "monitor": "the misuse counters on the device, not in Python (reparam._monitor)",
    "checks": "a bad score masked on the device and reported at the epoch end, not one host read "
    "(reparam._checks)",
    "sparse": "a large batch's rows spread over the rows, not compacted to its touched entries "
    "(reparam.sparse)",
    "notes": "the sparse rows' notes left as they are, not merged once they outgrow the rows",
    "owner": "a sharded batch's indices masked at the epoch end, not checked at the call",
    "root": "the tracked set's exact root by sort, not by the selection that reads sizes",
}
_FORCED: set[str] = set()


def tracing() -> bool:
    """Whether ``torch.compile`` is tracing the caller (its Python state is then guarded on)."""
    return torch.compiler.is_compiling()


def compiled_form(fork: str) -> bool:
    """Whether fork ``fork`` (``FORKS``) takes its compiled form: while traced, or when forced."""
    return tracing() or fork in _FORCED


def eager_on_cpu(tensor: torch.Tensor, fork: str) -> bool:
    """Whether a host read of ``tensor`` costs nothing: on the CPU, in fork ``fork``'s eager
    form."""
    return tensor.device.type == "cpu" and not compiled_form(fork)


@contextlib.contextmanager
def compiled_forms(*forks: str) -> Iterator[None]:
    """Inside the block the named ``forks`` take their compiled forms in eager code too (their
    cost measured apart: ``benchmarks.forks``). ``ValueError`` for a name not in ``FORKS``."""
    unknown = [f for f in forks if f not in FORKS]
    if unknown:
        raise ValueError(f"forks must be names of {sorted(FORKS)}, got {unknown}")
    before = set(_FORCED)
    _FORCED.update(forks)
    try:
        yield
    finally:
        _FORCED.clear()
        _FORCED.update(before)


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
