"""The PyTorch Lightning guide's example runs as written (docs/guide/lightning.md): the regularizer
as a submodule, ``attach`` in ``configure_optimizers``, ``end_epoch_`` in ``on_train_epoch_end``, and
Lightning's checkpoint restoring ``eps`` and ``tau`` exactly. Skipped without ``lightning``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

pytest.importorskip("lightning")

ROOT = Path(__file__).resolve().parents[1]


def test_lightning_guide_example_trains_and_restores_the_state(tmp_path, monkeypatch, capsys):
    text = (ROOT / "docs" / "guide" / "lightning.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", text, re.S)
    monkeypatch.chdir(tmp_path)  # the example writes lightning_runs/ where it runs
    torch.manual_seed(0)
    scope: dict = {"__name__": "lightning_guide"}
    exec(compile(code, "docs/guide/lightning.md", "exec"), scope)
    model, restored = scope["model"], scope["restored"]
    assert model.reg.stats()["epoch"] == 3  # end_epoch_ ran once per epoch
    for name, value in model.reg.state_dict().items():
        assert torch.equal(restored.reg.state_dict()[name], value), name
    assert (tmp_path / "lightning_runs" / "last.ckpt").is_file()
    printed = capsys.readouterr().out.strip().splitlines()[-1]  # tensor(F-beta)
    assert 0 < float(re.search(r"tensor\((.*)\)", printed).group(1)) <= 1
