"""Several processes (gloo on CPU): K processes with the same global batch train like one.

The processes are started with ``torch.multiprocessing.spawn`` (each joins the group from the
torchrun variables, as ``train.distributed.init_from_env`` expects) and, once, with ``torchrun``
itself. Each spawned rank saves what the test needs (its own model and regularizer, the indices
it evaluated) to a file; the assertions run here, in the pytest process.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from reparam import DenseTau, EpochEnd, FBetaRegularizer
from train import checkpoint, distributed, evaluation, loop
from train import config as C
from train import setup as train_setup
from train.data import load_data, make_loader
from train.metrics import GroupedConfusion
from train.models import build_model

ROOT = Path(__file__).resolve().parents[2]
N = 600  # digits_smnist: 300 digits + their rescaled copies per split
REG_STATE = ("eps_param", "tau_param", "lam", "mu", "scores")


def _overrides(data: Path, out: Path) -> list[str]:
    """demo.yaml as a test of the multi-process path: MLP (no batch norm), global batch 20
    (divides 600: no sampler padding), two epochs so that the second trains on the dual variables
    of the first, the projection at the epoch end and large dual steps."""
    return [
        f"data.path={data}",
        f"train.out={out}",
        "model.name=mlp",
        "model.hidden=[64]",
        "data.batch_size=20",
        "data.eval_batch_size=64",
        "train.epochs=2",
        "train.device=cpu",
        "regularizer.name=fbeta",
        "regularizer.alpha=0.1",
        "regularizer.projection=epoch",
        "regularizer.fbeta.dual_lr_lambda=0.1",
        "regularizer.fbeta.dual_lr_mu=0.1",
        "train.num_threads=1",
        "train.progress=false",
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _join_env(rank: int, world: int, port: int) -> None:
    """What ``torchrun`` puts in the environment of each process it starts."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(world),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
    )
    torch.set_num_threads(1)


def _spawn(fn: Callable[..., None], world: int, *args: Any) -> None:
    mp.spawn(fn, args=(world, _free_port(), *args), nprocs=world, join=True)


def _record(folder: str, rank: int, obj: dict[str, Any]) -> None:
    torch.save(obj, Path(folder) / f"rank{rank}.pt")


def _records(folder: Path, world: int) -> list[dict[str, Any]]:
    return [torch.load(folder / f"rank{r}.pt", weights_only=False) for r in range(world)]


# --- spawned processes (module level: ``spawn`` imports this module in each child) --------------


def _train_worker(rank: int, world: int, port: int, overrides: list[str], folder: str) -> None:
    """``loop.run`` as one rank of ``world``; saves this rank's final model, regularizer,
    returned summary and the test indices each evaluation saw."""
    _join_env(rank, world, port)
    built: dict[str, Any] = {}
    evaluated: list[list[int]] = []
    build_model_, build_regularizer_, evaluate_ = (
        train_setup.build_model,
        train_setup.build_regularizer,
        loop.evaluate,
    )

    def keep(name: str, build: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            built[name] = build(*args, **kwargs)
            return built[name]

        return wrapped

    def evaluate(model, loader, *args, **kwargs):
        seen: list[int] = []
        evaluated.append(seen)

        def batches():
            for batch in loader:
                seen.extend(batch["index"].tolist())
                yield batch

        return evaluate_(model, batches(), *args, **kwargs)

    train_setup.build_model = keep("model", build_model_)
    train_setup.build_regularizer = keep("regularizer", build_regularizer_)
    loop.evaluate = evaluate
    summary = loop.run(C.load(ROOT / "configs" / "demo.yaml", overrides), log=lambda *_: None)
    _record(
        folder,
        rank,
        {
            "model": built["model"].state_dict(),
            "regularizer": built["regularizer"].state_dict(),
            "summary": summary,
            "evaluated": evaluated,
        },
    )


def _pixel_worker(rank: int, world: int, port: int, overrides: list[str], folder: str) -> None:
    """``loop.run`` of the tiny COCO-Stuff config as one rank; saves its regularizer's state."""
    _join_env(rank, world, port)
    built: dict[str, Any] = {}
    build_regularizer_ = train_setup.build_regularizer

    def build_regularizer(*args: Any, **kwargs: Any) -> Any:
        built["regularizer"] = build_regularizer_(*args, **kwargs)
        return built["regularizer"]

    train_setup.build_regularizer = build_regularizer
    loop.run(C.load(ROOT / "configs" / "cocostuff_tiny.yaml", overrides), log=lambda *_: None)
    _record(folder, rank, {"regularizer": built["regularizer"].state_dict()})


def _poisoned_worker(rank: int, world: int, port: int, overrides: list[str], folder: str) -> None:
    """``loop.run`` as one rank of ``world`` whose training forward pass 3 gives NaN logits on
    rank 1 only; saves the final model, regularizer and summary."""
    _join_env(rank, world, port)
    built: dict[str, Any] = {}
    build_model_ = train_setup.build_model

    def build_model(*args: Any, **kwargs: Any) -> Any:
        model = built["model"] = build_model_(*args, **kwargs)
        forward, calls = model.forward, [0]

        def poisoned(x):
            logits, u = forward(x)
            calls[0] += model.training
            return (logits * float("nan") if rank == 1 and calls[0] == 3 else logits), u

        model.forward = poisoned
        return model

    train_setup.build_model = build_model
    summary = loop.run(C.load(ROOT / "configs" / "demo.yaml", overrides), log=lambda *_: None)
    _record(folder, rank, {"model": built["model"].state_dict(), "summary": summary})


def _poisoned_stop_worker(
    rank: int, world: int, port: int, overrides: list[str], folder: str
) -> None:
    """``_poisoned_worker`` under ``train.nonfinite=stop``: records the error this rank raised
    (each rank returns: one left waiting in a collective would hang ``spawn``)."""
    try:
        _poisoned_worker(rank, world, port, overrides, folder)
    except Exception as e:
        _record(folder, rank, {"error": f"{type(e).__name__}: {e}"})
        # leave as torchrun's agent ends a failed rank: freeing the network's DDP reducer would
        # join a gloo thread still waiting on a peer that has left (a hang, now and then)
        os._exit(0)
    _record(folder, rank, {"error": None})


def _resume_worker(rank: int, world: int, port: int, run_dir: str) -> None:
    """``loop.run(..., resume=run_dir)`` as one rank of ``world`` (the saved config, no stop)."""
    _join_env(rank, world, port)
    cfg = C.load(Path(run_dir) / "config.yaml", ["train.stop_after_steps=null"])
    loop.run(cfg, log=lambda *_: None, resume=run_dir)


def _unit_worker(rank: int, world: int, port: int, device: str, data: str, folder: str) -> None:
    """The collectives of ``train.distributed`` on tiny tensors, and ``evaluate`` on one shard."""
    _join_env(rank, world, port)
    ctx = distributed.init_from_env("cpu")  # gloo, also for CUDA tensors (one GPU, 2 processes)
    out: dict[str, Any] = {"ctx": (ctx.rank, ctx.world, ctx.local_rank, ctx.enabled, ctx.is_main)}
    dev = torch.device(device)

    # merge_scores_: rank 0 scored samples {0, 1}, rank 1 scored {1, 2}; nobody scored 3, whose
    # remembered score (7) is already equal everywhere. Stale values elsewhere must not leak in.
    reg = FBetaRegularizer(torch.tensor([1, 0, 1, 0]), schedule=EpochEnd(), tau=DenseTau()).to(dev)
    reg.scores[3] = 7.0
    reg.scores[2 if rank == 0 else 0] = -100.0 - rank  # stale: this rank did not score it
    idx, u = ([0, 1], [10.0, 20.0]) if rank == 0 else ([1, 2], [40.0, 30.0])
    reg(torch.tensor(u, device=dev), torch.tensor(idx, device=dev))  # writes scores, score_epoch
    written = torch.zeros(4, dtype=torch.bool)  # on the CPU, as the loop keeps it
    written[idx] = True
    reg._merge_scores_(written, distributed.all_reduce_)
    out["scores"], out["seen_ever"] = reg.scores.cpu(), reg.seen_ever.cpu()

    # average_gradients_: the mean over ranks; a missing gradient counts as zeros
    a = torch.nn.Parameter(torch.zeros(2, device=dev))
    b = torch.nn.Parameter(torch.zeros(2, 2, device=dev))
    a.grad = torch.tensor([1.0, 2.0], device=dev) * (rank + 1)
    b.grad = None if rank == 0 else torch.full((2, 2), 4.0, device=dev)
    distributed.average_gradients_([a, b])
    out["grads"] = tuple(None if p.grad is None else p.grad.cpu() for p in (a, b))
    out["all_reduce"] = distributed.all_reduce_(torch.tensor([rank + 1.0], device=dev)).cpu()
    out["path"] = distributed.broadcast_path(Path("/from/rank0") if rank == 0 else None)

    if device == "cpu":  # evaluate on this rank's shard; confusion matrices summed over ranks
        totals: list[int] = []

        class Counting(GroupedConfusion):
            def summary(self):
                totals.append(int(self.cm.sum()))
                return super().summary()

        evaluation.GroupedConfusion = Counting
        out["evaluate"], out["eval_total"] = _evaluate_fixed_model(data, rank, world), totals
    _record(folder, rank, out)
    distributed.shutdown()


def _evaluate_fixed_model(data: str, rank: int = 0, world: int = 1) -> dict[str, Any]:
    """``evaluate`` of a seeded, untrained MLP: on shard ``rank`` of ``world`` under
    ``torch.distributed``, on the whole test split without it."""
    cfg = C.from_dict({"data": {"path": data}, "model": {"name": "mlp", "hidden": [32]}})
    bundle = load_data(cfg.data)
    torch.manual_seed(0)
    model = build_model(cfg.model, bundle.image_shape, bundle.num_classes)
    loader = make_loader(
        bundle.test, 64, shuffle=False, rank=rank, world=world, distributed=world > 1
    )
    return loop.evaluate(model, loader, torch.device("cpu"), bundle.num_classes)


# --- training: 2 processes == 1 process ---------------------------------------------------------


@pytest.fixture(scope="session")
def runs(digits_smnist, tmp_path_factory) -> dict[int, tuple[Path, list[dict[str, Any]]]]:
    """The same config trained under torch.distributed by 1 and by 2 processes: world ->
    (run folder, per-rank records)."""
    base = tmp_path_factory.mktemp("distributed")
    found = {}
    for world in (1, 2):
        out, folder = base / f"run{world}", base / f"records{world}"
        folder.mkdir()
        _spawn(_train_worker, world, _overrides(digits_smnist, out), str(folder))
        found[world] = (out, _records(folder, world))
    return found


def test_two_processes_stop_and_resume_like_uninterrupted(runs, digits_smnist, tmp_path):
    """2 processes stopped mid-epoch 2 (step 40 of 60: the epoch's scores so far are merged into
    the checkpoint) and resumed by 2 new processes end exactly where the uninterrupted 2-process
    run ends."""
    out = tmp_path / "stopped"
    folder = tmp_path / "records"
    folder.mkdir()
    _spawn(
        _train_worker,
        2,
        [*_overrides(digits_smnist, out), "train.stop_after_steps=40"],
        str(folder),
    )
    stopped = checkpoint.latest(out)[1]
    assert (stopped["global_step"], stopped["epoch"], stopped["step_in_epoch"]) == (40, 1, 10)
    _spawn(_resume_worker, 2, str(out))
    resumed = checkpoint.latest(out)[1]
    reference = checkpoint.latest(runs[2][0])[1]
    assert resumed["global_step"] == reference["global_step"] == 60
    for part in ("model", "regularizer"):
        for key, value in reference[part].items():
            assert torch.equal(resumed[part][key], value), f"{part}.{key}"
    assert resumed["history"][-1]["test_accuracy"] == reference["history"][-1]["test_accuracy"]


def _fault_overrides(data: Path, out: Path, nonfinite: str, shard: str | None) -> list[str]:
    """One epoch under ``train.nonfinite``; with ``shard``, the regularizer sharded (the defaults'
    tracked threshold and sparse tau, which sharding needs)."""
    overrides = [*_overrides(data, out), "train.epochs=1", f"train.nonfinite={nonfinite}"]
    if shard is not None:
        overrides += [
            f"regularizer.shard={shard}",
            "regularizer.projection=tracked",
            "regularizer.fbeta.tau_update=sparse_adam_ahead",
        ]
    return overrides


@pytest.mark.parametrize(
    "shard",
    [
        None,
        pytest.param("global", marks=pytest.mark.slow),
        pytest.param("owner", marks=pytest.mark.slow),
    ],
)
def test_a_step_non_finite_on_one_process_is_skipped_by_all(digits_smnist, tmp_path, shard):
    """``train.nonfinite=skip`` (flag read every 100 steps): NaN logits on rank 1 only, at its
    step 3. The flag is or-reduced over the processes, so both drop the step (no rank waits in a
    collective the other skipped) and end with the same state, one step skipped; with a sharded
    regularizer (``regularizer.shard``, the defaults' sparse tau) each rank's sparse step count
    too."""
    out, folder = tmp_path / "run", tmp_path / "records"
    folder.mkdir()
    overrides = _fault_overrides(digits_smnist, out, "skip", shard)
    _spawn(_poisoned_worker, 2, overrides, str(folder))
    records = _records(folder, 2)
    for record in records:
        assert [h["skipped_steps_total"] for h in record["summary"]["history"]] == [1]
    for key, value in records[0]["model"].items():
        assert torch.equal(records[1]["model"][key], value), key
    final = checkpoint.latest(out)[1]
    assert final["global_step"] == N // 20 - 1 and final["skipped_steps"] == 1
    assert all(bool(torch.isfinite(v).all()) for v in final["model"].values())
    if shard is not None:  # rank 1's block, beside rank 0's checkpoint of the same step
        step = checkpoint.step_of(checkpoint.listing(out)[0])
        other = checkpoint.load(out / "checkpoints" / "shards" / f"step-{step:09d}.rank-1-of-2.pt")
        other = other.get("regularizer", other)
        for r in (final["regularizer"], other):
            assert int(r["sparse_tau.step"]) == N // 20 - 1
        assert torch.equal(final["regularizer"]["eps_param"], other["eps_param"])


@pytest.mark.parametrize("shard", [None, pytest.param("global", marks=pytest.mark.slow)])
def test_a_step_non_finite_on_one_process_stops_every_process(digits_smnist, tmp_path, shard):
    """``train.nonfinite=stop``: NaN logits on rank 1 only, at its step 3. The flag is or-reduced
    at the read, so every rank raises the same error naming that step, and none is left waiting in
    a collective; with a sharded regularizer too."""
    out, folder = tmp_path / "run", tmp_path / "records"
    folder.mkdir()
    overrides = _fault_overrides(digits_smnist, out, "stop", shard)
    _spawn(_poisoned_stop_worker, 2, overrides, str(folder))
    errors = [r["error"] for r in _records(folder, 2)]  # (each names its own task loss)
    for error in errors:
        assert error is not None and "non-finite loss or shape score at epoch 1 step 3" in error


def test_two_processes_train_like_one(runs):
    (out1, _), (out2, _) = runs[1], runs[2]
    one, two = checkpoint.latest(out1)[1], checkpoint.latest(out2)[1]
    assert one["epoch"] == two["epoch"] == 2
    assert one["global_step"] == two["global_step"] == 2 * N // 20  # global batch 20 in both
    assert one["model"].keys() == two["model"].keys()
    for k in one["model"]:
        torch.testing.assert_close(two["model"][k], one["model"][k], rtol=0, atol=1e-5, msg=k)
    r1, r2 = one["regularizer"], two["regularizer"]
    for k in REG_STATE:
        torch.testing.assert_close(r2[k], r1[k], rtol=0, atol=1e-5, msg=k)
    seen1, seen2 = (r["score_epoch"] >= 0 for r in (r1, r2))  # seen_ever
    assert torch.equal(seen2, seen1) and bool(seen1.all())
    assert int(r1["projections"]) == int(r2["projections"]) == 2
    # the comparison means something: the dual step moved lambda and mu, and the second epoch
    # trained on them
    assert float(r1["lam"].max()) > 0.01 and float((r1["mu"] + 1).abs().max()) > 1e-3
    m1, m2 = (json.loads((o / "metrics.json").read_text())["history"] for o in (out1, out2))
    for h1, h2 in zip(m1, m2, strict=True):
        assert h1["test_accuracy"] == h2["test_accuracy"]
        assert h1["test_shape_fbeta"] == pytest.approx(h2["test_shape_fbeta"], abs=1e-9)
        assert h1["train_loss"] == pytest.approx(h2["train_loss"], rel=1e-5)
        assert h1["reg_loss"] == pytest.approx(h2["reg_loss"], rel=1e-4, abs=1e-6)
        assert h1["reg_eps"] == pytest.approx(h2["reg_eps"], abs=1e-5)


@pytest.mark.parametrize(
    "rule, projection",
    [
        pytest.param("sparse_adam_ahead", "epoch", marks=pytest.mark.slow),
        # the defaults: tau and eps start equal (1, 1), at the kink of min(tau_k, e*), and there
        # one row's first gradient follows the 1e-7 rounding of eps between 1 and 2 processes
        # (measured: row 47 of 300, at every tau_lr), so that row may end elsewhere
        ("sparse_adam_ahead", "tracked"),
    ],
)
def test_sparse_tau_two_processes_train_like_one(rule, projection, digits_smnist, tmp_path):
    """``regularizer.fbeta.tau_update=sparse_adam_ahead`` under torch.distributed: every step the processes
    exchange their batch's touched rows of tau (``share_sparse_grads_``) and take the same sparse
    step, so 2 processes end where 1 does (the projection once per epoch: the sparse modes'), and
    both ranks hold the same state. Projection ``"tracked"``: the active set of the threshold is
    re-tested on every process's touched rows, so it stays replicated too."""
    extra = [
        "regularizer.fbeta.tau_update=" + rule,
        "regularizer.fbeta.tau_lr=0.1",
        f"regularizer.projection={projection}",
    ]
    found = {}
    for world in (1, 2):
        out, folder = tmp_path / f"run{world}", tmp_path / f"records{world}"
        folder.mkdir()
        _spawn(_train_worker, world, [*_overrides(digits_smnist, out), *extra], str(folder))
        found[world] = _records(folder, world)
    one, (rank0, rank1) = found[1][0]["regularizer"], found[2]
    keys = [*REG_STATE, "sparse_tau.moments", "sparse_tau.step", "sparse_tau.last"]
    keys += ["schedule.tau_active", "schedule.active_sums"] if projection == "tracked" else []
    kink = projection == "tracked"
    for k in keys:
        assert torch.equal(rank0["regularizer"][k], rank1["regularizer"][k]), k  # replicated
        two_k, one_k = rank0["regularizer"][k], one[k]
        if kink and k in ("tau_param", "lam", "sparse_tau.moments"):  # per row: all but the kink's
            far = (two_k.double() - one_k.double()).abs().reshape(len(one_k), -1) > 1e-5
            assert int(far.any(1).sum()) <= 1, k
        else:  # mu sums over the rows, the kink's too
            atol = 1e-4 if kink and k == "mu" else 1e-5
            torch.testing.assert_close(two_k, one_k, rtol=0, atol=atol, msg=k)
    for k, value in found[1][0]["model"].items():
        torch.testing.assert_close(rank0["model"][k], value, rtol=0, atol=1e-5, msg=k)
    # the comparison means something: the rows of tau moved apart (per-row lambda)
    assert float(one["tau_param"].max() - one["tau_param"].min()) > 1e-3
    assert int(one["sparse_tau.step"]) == 2 * N // 20
    if projection == "tracked":  # the threshold's active set is neither empty nor everything
        assert 0 < float(one["schedule.active_sums"][0, 1]) < one["tau_param"].numel()


def test_the_per_image_fbeta_on_two_processes_keeps_one_state(coco_cache_sky, tmp_path):
    """``regularizer.target: pixels`` (the samples are pixels, ~B H W a step) under 2 processes:
    each exchanges its batch's touched pixel rows (padded to its B H W pixels, the same on every
    rank), and both ranks end with the same regularizer state, moved by the steps."""
    overrides = [
        f"data.path={coco_cache_sky}",
        f"train.out={tmp_path / 'run'}",
        "regularizer.name=fbeta",
        "regularizer.alpha=1.0",
        "regularizer.target=pixels",
        "regularizer.projection=null",
        "data.scale_range=null",
        "train.epochs=1",
        "train.device=cpu",
        "train.num_threads=1",
        "train.progress=false",
    ]
    folder = tmp_path / "records"
    folder.mkdir()
    _spawn(_pixel_worker, 2, overrides, str(folder))
    rank0, rank1 = (r["regularizer"] for r in _records(folder, 2))
    for k, value in rank0.items():
        assert torch.equal(value, rank1[k]), k
    assert int(rank0["sparse_tau.step"]) > 0
    assert float(rank0["sparse_tau.moments"].abs().sum()) > 0


@pytest.mark.slow  # (default suite: test_two_processes_stop_and_resume_like_uninterrupted)
def test_sparse_tau_two_processes_stop_and_resume_bit_for_bit(digits_smnist, tmp_path):
    """A sparse ``tau`` under 2 processes, stopped mid-epoch 2 (step 40 of 60) and resumed by 2 new
    processes: the same model and regularizer state (moments, step count and last touches
    included), bit for bit, as the uninterrupted 2-process run."""
    extra = [
        "regularizer.projection=epoch",
        "regularizer.fbeta.tau_update=sparse_adam_ahead",
        "regularizer.fbeta.tau_lr=0.1",
    ]
    ends = []
    for name, stop in (("whole", []), ("stopped", ["train.stop_after_steps=40"])):
        out, folder = tmp_path / name, tmp_path / f"records-{name}"
        folder.mkdir()
        _spawn(_train_worker, 2, [*_overrides(digits_smnist, out), *extra, *stop], str(folder))
        if stop:
            assert checkpoint.latest(out)[1]["global_step"] == 40
            _spawn(_resume_worker, 2, str(out))
        ends.append(checkpoint.latest(out)[1])
    whole, resumed = ends
    assert whole["global_step"] == resumed["global_step"] == 60
    for part in ("model", "regularizer"):
        for key, value in whole[part].items():
            assert torch.equal(resumed[part][key], value), f"{part}.{key}"
    assert int(whole["regularizer"]["sparse_tau.step"]) == 60


def test_every_rank_ends_with_the_same_state(runs):
    _, (rank0, rank1) = runs[2]
    for k in (*REG_STATE, "score_epoch", "epoch", "projections"):
        assert torch.equal(rank0["regularizer"][k], rank1["regularizer"][k]), k
    for k in rank0["model"]:
        assert torch.equal(rank0["model"][k], rank1["model"][k]), k
    # rank 0 saved what it held
    saved = checkpoint.latest(runs[2][0])[1]
    for k in REG_STATE:
        assert torch.equal(saved["regularizer"][k], rank0["regularizer"][k]), k


def test_evaluation_counts_every_test_sample_once(runs):
    _, (rank0, rank1) = runs[2]
    assert len(rank0["evaluated"]) == len(rank1["evaluated"]) == 2  # once per epoch
    for a, b in zip(rank0["evaluated"], rank1["evaluated"], strict=True):
        assert not set(a) & set(b)
        assert sorted(a + b) == list(range(N))
    (single,) = runs[1][1]
    assert all(sorted(seen) == list(range(N)) for seen in single["evaluated"])
    # every rank reports the global metrics (summed confusion), equal to those of one process
    keys = ("test_accuracy", "test_accuracy_small", "test_accuracy_big", "test_shape_fbeta")
    final = [r["summary"]["final"] for r in (single, rank0, rank1)]
    assert [f[k] for k in keys for f in final[1:]] == [final[0][k] for k in keys for _ in "01"]


def test_torchrun_cli(digits_smnist, runs, tmp_path):
    """``torchrun --nproc_per_node=2 -m train``: the same run as the spawned one; rank 0 logs."""
    proc = subprocess.run(
        [
            *distributed.torchrun_command(2),
            "--config",
            "configs/demo.yaml",
            *_overrides(digits_smnist, tmp_path / "run"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("run folder ") == 1 and "2 process(es)" in proc.stdout
    assert proc.stdout.count("epoch   2") == 1
    final = json.loads((tmp_path / "run" / "metrics.json").read_text())["final"]
    spawned = runs[2][1][0]["summary"]["final"]
    assert final["test_accuracy"] == spawned["test_accuracy"]
    assert final["reg_eps"] == pytest.approx(spawned["reg_eps"], abs=1e-6)


# --- the collectives -----------------------------------------------------------------------------


def test_collectives_on_two_processes(device, digits_smnist, tmp_path):
    _spawn(_unit_worker, 2, device, str(digits_smnist), str(tmp_path))
    rank0, rank1 = _records(tmp_path, 2)
    assert rank0["ctx"] == (0, 2, 0, True, True) and rank1["ctx"] == (1, 2, 1, True, False)
    for r in (rank0, rank1):
        # sample 1: mean of both ranks' scores; 0 and 2: the one rank's; 3: kept
        assert r["scores"][:, 0].tolist() == [10.0, 30.0, 30.0, 7.0]
        assert r["seen_ever"].tolist() == [True, True, True, False]
        torch.testing.assert_close(r["grads"][0], torch.tensor([1.5, 3.0]), rtol=0, atol=0)
        torch.testing.assert_close(r["grads"][1], torch.full((2, 2), 2.0), rtol=0, atol=0)
        assert r["all_reduce"].tolist() == [3.0]
        assert r["path"] == Path("/from/rank0")
    if device == "cpu":
        whole = _evaluate_fixed_model(str(digits_smnist))
        assert rank0["eval_total"] == rank1["eval_total"] == [N]  # summed, each sample once
        assert rank0["evaluate"] == rank1["evaluate"] == whole


def test_collectives_are_identities_in_one_process(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert distributed.init_from_env("cpu") == distributed.Context()  # plain `python -m train`
    assert not distributed.is_initialized()
    reg = FBetaRegularizer(torch.tensor([1, 0, 1, 0]))
    reg(torch.tensor([1.0, 2.0]), torch.tensor([0, 1]))
    before = {k: v.clone() for k, v in reg.state_dict().items()}
    reg._merge_scores_(torch.tensor([True, True, False, False]), distributed.all_reduce_)
    assert all(torch.equal(before[k], v) for k, v in reg.state_dict().items())
    p = torch.nn.Parameter(torch.zeros(2))
    p.grad = g = torch.tensor([1.0, 2.0])
    distributed.average_gradients_([p])
    assert p.grad is g and p.grad.tolist() == [1.0, 2.0]
    assert distributed.all_reduce_(torch.tensor([3.0])).tolist() == [3.0]
    assert not dist.is_initialized()


def test_global_batch_must_divide_among_processes(digits_smnist, tmp_path, monkeypatch):
    """Checked before anything is written: a corrected re-run may use the same folder."""
    monkeypatch.setattr(distributed, "init_from_env", lambda *_: distributed.Context(0, 2, 0))
    out = tmp_path / "run"
    cfg = C.load(
        ROOT / "configs" / "demo.yaml", [*_overrides(digits_smnist, out), "data.batch_size=25"]
    )
    with pytest.raises(ValueError, match=r"data\.batch_size 25 .*divisible by .* processes 2"):
        loop.run(cfg, log=lambda *_: None)
    assert not out.exists() or not any(out.iterdir())


def test_rate_objectives_step_their_duals_per_epoch_under_several_processes(monkeypatch):
    """The per-step dual step would step ``nu`` on each rank's own batches: under torchrun the
    trainer builds the rate objectives with ``dual_every="epoch"``; asking for "step" is an error."""
    from train import build

    cfg = C.from_dict(
        {"regularizer": {"name": "precision_at_recall", "precision_at_recall": {"recall": 0.9}}}
    )
    labels = torch.tensor([0, 1, 1, 0])
    assert build.build_regularizer(cfg.regularizer, labels).dual_every == "step"
    monkeypatch.setattr(build, "_processes", lambda: 2)
    assert build.build_regularizer(cfg.regularizer, labels).dual_every == "epoch"
    cfg.regularizer.precision_at_recall.dual_every = "step"
    with pytest.raises(ValueError, match="dual_every=step runs in one process only"):
        build.build_regularizer(cfg.regularizer, labels)
