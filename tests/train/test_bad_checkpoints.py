"""Bad checkpoint files as a user meets them: truncated, corrupt (fuzzed), not a checkpoint of this
project, a pickle that would run code; what ``--resume`` says about them; and a start that fails
on its inputs leaves no run folder behind."""

from __future__ import annotations

import io
import random
import re
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from reparam import FBetaRegularizer
from train import checkpoint, sharded_state
from train import config as C
from train.__main__ import main
from train.loop import run
from train.models import SMNISTNet
from train.state import TrainState, check_format

from .run_utils import DEMO, assert_bitwise_equal, final_checkpoint, quiet, smnist_cfg

SKIPPED = re.compile(
    r"skipped: (checkpoint \S+ is truncated or corrupt \(\d+ bytes\)"
    r"|\S+ is not a checkpoint of this project \([^\n]*\)); (trying an older one|no older one)"
)


def small_checkpoint() -> dict[str, Any]:
    """A training checkpoint as the trainer writes it (``TrainState.state_dict``), of a small MLP
    and an F-beta regularizer after two optimizer steps (Adam and the regularizer's state set)."""
    torch.manual_seed(0)
    n = 64
    model = SMNISTNet((8, 8), 10, C.ModelConfig(name="mlp", hidden=[16]))
    reg = FBetaRegularizer(torch.arange(n) % 3 == 0)
    optimizer = torch.optim.Adam([*model.parameters(), *reg.parameters()], lr=1e-2)
    reg.attach(optimizer)
    generator = torch.Generator().manual_seed(1)
    state = TrainState({"train": {"seed": 0}}, model, optimizer, None, None, reg, generator)
    state.begin_epoch(torch.device("cpu"))
    for idx in torch.randperm(n, generator=generator)[:32].split(16):
        logits, u = model(torch.rand(len(idx), 8, 8))
        loss = logits.logsumexp(1).mean() + reg(u.squeeze(-1), idx)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        state.global_step += 1
        state.step_in_epoch += 1
    return state.state_dict()


def _bytes(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _write(run_dir: Path, step: int, data: bytes) -> Path:
    path = checkpoint.path_for(run_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _latest(run_dir: Path) -> tuple[tuple[Path, Any] | None, list[str]]:
    """``latest`` as ``--resume`` calls it: (what it found, the lines of the files it skipped);
    fails on any warning (torch's included)."""
    lines: list[str] = []
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        found = checkpoint.latest(run_dir, check=check_format, skipped=lines.append)
    assert not record, [f"{w.category.__name__}: {w.message}" for w in record]
    return found, lines


def _assert_one_clean_line(line: str, path: Path, where: str = "") -> None:
    """The line a skipped file gets: one line naming ``path``, no advice from torch."""
    assert "\n" not in line, f"{where}: {line!r}"
    assert str(path) in line, f"{where}: {line!r}"
    assert "weights_only" not in line and "weights only" not in line.lower(), f"{where}: {line!r}"
    assert SKIPPED.fullmatch(line), f"{where}: {line!r}"


# --- single files -----------------------------------------------------------------------------


def test_a_truncated_checkpoint_is_named_truncated_or_corrupt(tmp_path):
    data = _bytes(small_checkpoint())
    for n in (0, 3, 4, 100, len(data) // 2, len(data) - 1):
        path = _write(tmp_path, 1, data[:n])
        with pytest.raises(checkpoint.CheckpointError) as e:
            checkpoint.load(path)
        assert str(e.value) == f"checkpoint {path} is truncated or corrupt ({n} bytes)"


def test_a_flipped_bit_torch_would_load_silently_is_caught(tmp_path):
    """torch's zip reader checks no CRC-32: a bit flipped in a tensor's bytes loads as another
    value. ``load`` checks the archive's checksums first."""
    original = small_checkpoint()
    data = bytearray(_bytes(original))
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as archive:
        info = next(i for i in archive.infolist() if re.search(r"/data/\d+$", i.filename))
    name_and_extra = int.from_bytes(
        data[info.header_offset + 26 : info.header_offset + 28], "little"
    )
    name_and_extra += int.from_bytes(
        data[info.header_offset + 28 : info.header_offset + 30], "little"
    )
    data[info.header_offset + 30 + name_and_extra] ^= 0x40  # the member's first byte
    loaded = torch.load(io.BytesIO(bytes(data)), weights_only=True)  # torch alone: no error
    with pytest.raises(AssertionError, match="tensors differ"):
        assert_bitwise_equal(original, loaded)
    path = _write(tmp_path, 1, bytes(data))
    with pytest.raises(checkpoint.CheckpointError, match=r"is truncated or corrupt \(\d+ bytes\)$"):
        checkpoint.load(path)


def test_random_bytes_are_not_a_checkpoint_and_torch_advice_is_not_passed_on(tmp_path):
    """torch's own error for such a file advises ``weights_only=False``, which would run any code
    in it: never passed on."""
    path = _write(tmp_path, 1, random.Random(0).randbytes(5000))
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.load(path)
    assert str(e.value) == (
        f"{path} is not a checkpoint of this project (not a file torch.save writes)"
    )
    assert e.value.__cause__ is None and e.value.__context__ is None
    np.savez(tmp_path / "arrays.npz", a=np.zeros(3))  # a zip archive, but not torch's
    with pytest.raises(
        checkpoint.CheckpointError, match=r"a zip archive torch\.save did not write"
    ):
        checkpoint.load(tmp_path / "arrays.npz")


class _Payload:
    """Unpickling this creates the file ``marker`` (a stand-in for any code)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple:
        return open, (self.marker, "w")


def test_a_pickle_that_would_run_code_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "marker"
    payload = {**small_checkpoint(), "extra": _Payload(marker)}
    data = _bytes(payload)
    torch.load(io.BytesIO(data), weights_only=False).pop("extra").close()  # the payload is live
    assert marker.exists()
    marker.unlink()
    path = _write(tmp_path, 1, data)
    with pytest.raises(checkpoint.CheckpointError) as e:
        checkpoint.load(path)
    assert str(e.value) == (
        f"{path} is not a checkpoint of this project (it holds Python objects other than tensors "
        f"and plain containers, which are never unpickled here)"
    )
    # torch's error (its advice) is neither the cause nor shown as the context
    assert e.value.__cause__ is None and e.value.__suppress_context__
    found, lines = _latest(tmp_path)
    assert found is None and len(lines) == 1
    _assert_one_clean_line(lines[0], path)
    assert not marker.exists()


def test_torch_files_that_are_not_training_checkpoints_are_skipped(tmp_path):
    state = small_checkpoint()
    _write(tmp_path, 1, _bytes(state))
    not_ours = {
        2: (torch.zeros(3), "it holds an object of type Tensor, not a training state"),
        3: ({"step": 3}, "it holds a dict without the key 'format', not a training state"),
        4: ({k: v for k, v in state.items() if k != "optimizer"}, "format 2, but no 'optimizer'"),
    }
    for step, (obj, _) in not_ours.items():
        _write(tmp_path, step, _bytes(obj))
    found, lines = _latest(tmp_path)
    assert found[0] == checkpoint.path_for(tmp_path, 1)
    assert_bitwise_equal(state, found[1])
    assert len(lines) == 3
    for line, step in zip(lines, (4, 3, 2), strict=True):
        path = checkpoint.path_for(tmp_path, step)
        _assert_one_clean_line(line, path)
        assert f"{path} is not a checkpoint of this project ({not_ours[step][1]})" in line
    # a checkpoint of another layout is not skipped: the error says which version wrote it
    _write(tmp_path, 5, _bytes({**state, "format": 1}))
    with pytest.raises(ValueError, match=r"has format 1, this trainer reads format 2"):
        checkpoint.latest(tmp_path, check=check_format)


def test_a_training_state_has_every_key_the_check_asks_for():
    state = small_checkpoint()
    check_format(state, "x")
    for key in state.keys() - {"format", "config", "epoch_totals", "groups"}:
        with pytest.raises(checkpoint.CheckpointError, match=f"but no '{key}'"):
            check_format({k: v for k, v in state.items() if k != key}, "x")


def test_an_unusable_regularizer_shard_is_one_line_naming_it(tmp_path):
    """A sharded run's resume reads rank r's block from its own file: the same checks."""
    found = _write(tmp_path, 5, b"")  # (only its name is used here)
    shard = sharded_state.shard_path(tmp_path, 5, 1, 2)
    shard.parent.mkdir(parents=True)
    shard.write_bytes(_bytes({"regularizer": {"eps": torch.zeros(1)}})[:200])
    with pytest.raises(ValueError) as e:
        sharded_state._shard(found, 1, 2)
    assert str(e.value) == (
        f"checkpoint {found}: the regularizer shard of rank 1 is unusable: checkpoint {shard} is "
        f"truncated or corrupt (200 bytes); restore it, or start a new run"
    )
    shard.write_bytes(_bytes(torch.zeros(1)))
    with pytest.raises(ValueError, match=r"rank 1, \S+, is not a checkpoint of this project"):
        sharded_state._shard(found, 1, 2)


# --- fuzzing: truncations and flipped bits of a real checkpoint --------------------------------


def _mutate(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """A truncation at a random length, one flipped bit, one random byte, or 2-8 flipped bits."""
    kind = rng.choice(("truncate", "flip", "byte", "flips"))
    if kind == "truncate":
        n = rng.randrange(len(data))
        return data[:n], f"truncated to {n} of {len(data)} bytes"
    out, where = bytearray(data), []
    for _ in range(1 if kind != "flips" else rng.randint(2, 8)):
        pos = rng.randrange(len(out))
        if kind == "byte":
            out[pos] = rng.choice([b for b in range(256) if b != out[pos]])
        else:
            out[pos] ^= 1 << rng.randrange(8)
        where.append(pos)
    return bytes(out), f"{kind} at byte(s) {where}"


def fuzz(run_dir: Path, original: dict[str, Any], seeds: range) -> dict[str, int]:
    """Each seed: the newest checkpoint mutated (``_mutate``), an intact one before it. Either the
    newest loads with exactly the original content, or it is skipped with one clean line naming
    it and the intact one is returned. Returns the count of each outcome."""
    data = _bytes(original)
    older = _write(run_dir, 1, data)
    newest = checkpoint.path_for(run_dir, 2)
    outcomes = {"identical": 0, "skipped": 0}
    for seed in seeds:
        mutated, what = _mutate(data, random.Random(seed))
        newest.write_bytes(mutated)
        where = f"fuzz seed {seed} ({what})"
        try:
            found, lines = _latest(run_dir)
        except Exception as e:  # anything raised is a failure of this case
            pytest.fail(f"{where}: latest raised {type(e).__name__}: {e}")
        assert found is not None, f"{where}: nothing found"
        if found[0] == newest:
            assert not lines, f"{where}: {lines}"
            assert_bitwise_equal(original, found[1], where)
            outcomes["identical"] += 1
        else:
            assert found[0] == older and len(lines) == 1, f"{where}: {found[0]}, {lines}"
            _assert_one_clean_line(lines[0], newest, where)
            outcomes["skipped"] += 1
    return outcomes


def test_fuzzed_checkpoints_load_identically_or_are_skipped_with_one_line(tmp_path):
    outcomes = fuzz(tmp_path, small_checkpoint(), range(20))
    assert outcomes["skipped"] >= 10, outcomes


@pytest.mark.slow
def test_fuzzed_trainer_checkpoints_load_identically_or_are_skipped_with_one_line(
    digits_smnist, tmp_path
):
    """400 mutations of a checkpoint the trainer wrote (the demo's MLP and F-beta regularizer,
    mid-epoch)."""
    out = tmp_path / "run"
    run(smnist_cfg(digits_smnist, out, "train.stop_after_steps=4"), log=quiet)
    original = final_checkpoint(out)
    outcomes = fuzz(tmp_path / "fuzz", original, range(1000, 1400))
    assert outcomes["skipped"] >= 200 and sum(outcomes.values()) == 400, outcomes


# --- what --resume says, and a failed start ----------------------------------------------------


def test_resume_with_only_unusable_checkpoints_says_one_line_each(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    C.save(C.load(DEMO, [f"data.path={tmp_path / 'no-data'}"]), run_dir / "config.yaml")
    data = _bytes(small_checkpoint())
    paths = [
        _write(run_dir, 1, data[: len(data) // 3]),
        _write(run_dir, 2, random.Random(0).randbytes(3000)),
        _write(run_dir, 3, _bytes(torch.zeros(2))),
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["--resume", str(run_dir)]) == 2
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert len(lines) == 3
    for line, path in zip(lines, paths[::-1], strict=True):
        assert line.startswith("warning: ")
        _assert_one_clean_line(line.removeprefix("warning: "), path)
    assert captured.err == (
        f"error: --resume {str(run_dir)!r}: no readable checkpoint in {run_dir / 'checkpoints'} "
        f"(3 unusable, each named in a warning)\n"
    )


@pytest.mark.parametrize(
    "bad",
    [["data.path=NO_DATA"], ["model.shape_input=logits", "model.shared_gemm=true"]],
    ids=["missing-data", "model-not-buildable"],
)
def test_a_failed_start_leaves_no_run_folder(digits_smnist, tmp_path, monkeypatch, capsys, bad):
    """Nothing is written before the inputs are checked: neither the ``--out`` folder nor a
    default one, so the next run gets the name without ``-2``."""
    bad = [b.replace("NO_DATA", str(tmp_path / "no-data")) for b in bad]
    args = ["--config", str(DEMO), f"data.path={digits_smnist}", "train.progress=false"]
    assert main([*args, "--out", str(tmp_path / "run"), *bad]) == 2
    assert capsys.readouterr().err.startswith("error: ")
    assert not (tmp_path / "run").exists()
    monkeypatch.chdir(tmp_path)
    assert main([*args, *bad]) == 2
    assert not (tmp_path / "runs").exists()
    assert main([*args, "train.epochs=1", "train.checkpoint=false"]) == 0
    assert [p.name for p in (tmp_path / "runs" / "demo").iterdir()] == ["fbeta-a0.01-tracked-seed0"]
