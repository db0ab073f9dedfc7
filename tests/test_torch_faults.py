"""Faults of torch itself met while compiling the project's training steps, each as a minimal
repro (``xfail``, strict: when a torch release mends one, its test fails as an unexpected pass,
and the note about it in the docs can go)."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.exc import BackendCompilerFailed


@pytest.mark.xfail(
    strict=True,
    raises=BackendCompilerFailed,
    reason=(
        f"torch {torch.__version__}: inductor's pass that turns Python float scalars into "
        "tensors (torch.fx.passes._tensorify_python_scalars) has no rule for a Python modulo: "
        "AttributeError, TensorReferenceAnalysis has no attribute 'python_mod' (torch 2.11 "
        "raised it compiling a DeepLabV3+ step with mode='reduce-overhead' on CUDA)"
    ),
)
def test_inductor_compiles_a_float_made_from_the_remainder_of_a_dynamic_size():
    """A float scalar computed from ``(size - c) % k`` (a remainder whose sign dynamo cannot
    prove, so a Python modulo, ``PythonMod``) with dynamic shapes: inductor fails to compile."""

    def scaled(x):
        return x * (1.0 / ((x.shape[0] - 20) % 7 + 1))

    x = torch.randn(10)
    torch.testing.assert_close(torch.compile(scaled, dynamic=True)(x), scaled(x))
