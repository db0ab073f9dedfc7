"""``benchmarks.forks``: an arm runs one module's compiled forms eagerly, and the script writes its
table and plot (no timing is asserted)."""

from __future__ import annotations

import pytest
import torch

from benchmarks import forks
from reparam import _checks, sparse
from reparam.compiling import compiled_forms


def test_an_arm_switches_the_forms_of_its_forks_only():
    u, idx = torch.randn(5), torch.arange(5)
    big = torch.zeros(sparse.COMPACT_FROM, dtype=torch.int32)
    assert _checks.batch(u, idx, (1,), 10, torch.device("cpu"))[2] is None  # eager: host check
    with compiled_forms(*forks.FORKS["_checks"]):
        ok = _checks.batch(u, idx, (1,), 10, torch.device("cpu"))[2]  # compiled: masks
        assert ok is not None and bool(ok[0].all()) and bool(ok[1].all())
        assert sparse.compacts(big)  # the other forks keep their eager forms
    assert _checks.batch(u, idx, (1,), 10, torch.device("cpu"))[2] is None  # restored
    with compiled_forms("sparse"):
        assert not sparse.compacts(big)
    with pytest.raises(ValueError, match="forks must be names of"):
        with compiled_forms("spares"):
            pass


def test_the_forks_benchmark_writes_its_table(tmp_path, capsys):
    forks.main(["--batches", "20", "--steps", "2", "--out", str(tmp_path)])
    text = (tmp_path / "forks.md").read_text()
    assert "| 20 | eager forms |" in text and "| 20 | all compiled forms |" in text
    assert (tmp_path / "forks.png").stat().st_size > 0
    assert "added by the compiled forms" in capsys.readouterr().out
