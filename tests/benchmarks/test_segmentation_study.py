"""benchmarks.segmentation_study end to end on a CamVid-layout folder: the grid, a resumed sweep,
the table and the figure."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from benchmarks.segmentation_study import __main__ as cli
from benchmarks.segmentation_study import spec
from benchmarks.segmentation_study.fit import split_summary
from benchmarks.segmentation_study.timing import timing
from tests.data_prep.test_camvid import write_layout

ROOT = Path(__file__).resolve().parents[2]


def test_grid_is_task_major_and_every_method_shares_data_seed_and_epochs():
    grid = spec.jobs(None, [0, 1], ["sky", "all"], list(spec.METHODS), size=(60, 80))
    assert len(grid) == 2 * 2 * len(spec.METHODS)
    per_task = 2 * len(spec.METHODS)
    assert [t for t, *_ in grid] == ["sky"] * per_task + ["all"] * per_task  # sky finishes first
    keys = [job.key for *_, job in grid]
    assert len(set(keys)) == len(keys)
    for task, _, job in grid:
        shared = [o for o in job.overrides if o.startswith(("data.", "train.epochs", "train.seed"))]
        epochs = spec.TASKS[task][3]
        assert shared[0] == f"data.path={spec.cache(task, (60, 80))}"
        assert shared[1:] == [f"train.epochs={epochs}", f"train.seed={job.key[-1]}"]


def test_the_shipped_sky_recipe_is_the_studys_measured_arm():
    """configs/camvid_sky_sharp.yaml trains what the study's "U-Net + Lovasz per image + CE" on
    sky at 120x160 trained (the numbers docs/segmentation/small-objects.md gives for it), but for its name and
    the cache's folder (data_prep.camvid's default size is 120x160)."""
    from train import config as C

    size = (120, 160)
    (job,) = [j for *_, j in spec.jobs(None, [0], ["sky"], ["U-Net + Lovasz per image + CE"], size)]
    studied = C.load(ROOT / job.config, list(job.overrides)).to_dict()
    shipped = C.load(ROOT / "configs" / "camvid_sky_sharp.yaml").to_dict()
    assert shipped.pop("experiment") == "camvid_sky_sharp"
    studied.pop("experiment")
    assert (shipped["data"].pop("path"), studied["data"].pop("path")) == (
        "data/camvid-sky",
        "data/camvid-sky-120x160",
    )
    assert shipped == studied


def test_a_timing_trains_what_the_run_of_the_method_trains():
    """``timing`` builds each method from ``spec.method_overrides``, as ``jobs`` does: the task's
    settings of a method (the 11-class per-image F-beta scores every class) and the recipe."""
    size = (120, 160)
    for task, method in [("all", "per-image F-beta"), ("sky", "Dice"), ("all", "baseline")]:
        (job,) = [j for t, m, j in spec.jobs(None, [0], [task], [method], size=size)]
        assert job.overrides[:-2] == spec.method_overrides(task, method, size)
    wanted = spec.method_overrides("all", "per-image F-beta", size)
    assert "regularizer.fbeta.positive_classes=[0,1,2,3,4,5,6,7,8,9,10]" in wanted
    assert "optim.schedule=poly" in wanted


@pytest.mark.slow  # a small study run end to end (the default suite's time)
def test_run_then_table_on_a_small_camvid_folder(tmp_path, monkeypatch, capsys):
    camvid = write_layout(tmp_path / "camvid", n=4, hw=(32, 48))
    monkeypatch.chdir(tmp_path)  # caches under ./data, configs from ./configs
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    args = [
        "--camvid",
        str(camvid),
        "--runs",
        "runs",
        "--out",
        "figs",
        "--size",
        "32",
        "48",
        "--epochs",
        "1",
        "--seeds",
        "0",
        "--tasks",
        "sky",
        "--jobs",
        "1",
        "--methods",
        "baseline",
        "group DRO",
    ]
    assert cli.main(["run", *args]) == 0
    assert "2 of 2 runs to do" in capsys.readouterr().out
    assert cli.main(["run", *args]) == 0  # finished runs are reused
    assert "0 of 2 runs to do" in capsys.readouterr().out
    assert cli.main(["archive", *args, "--archive", "kept"]) == 0  # figures only, no checkpoints
    kept = sorted(
        p.relative_to(tmp_path / "kept").as_posix() for p in (tmp_path / "kept").rglob("*.*")
    )
    assert kept == [
        "floor-sky-32x48.json",  # the cache's 1-pixel boundary floor, for a clone without it
        *(
            f"{k}/{n}"
            for k in ("sky-32x48-baseline-seed0", "sky-32x48-group_DRO-seed0")  # size in the key
            for n in ("config.yaml", "metrics.json", "per_image_test.npz")
        ),
    ]
    assert cli.main(["picture", *args, "--best", "group DRO"]) == 0  # from the runs' checkpoints
    assert (tmp_path / "figs" / "segmentation_study_smallest_sky_32x48.png").stat().st_size > 0
    assert cli.main(["fit", *args]) == 0  # train split beside test, from the same checkpoints
    fitted = (tmp_path / "figs" / "segmentation_study_fit_sky_32x48.md").read_text()
    assert fitted.startswith("<!-- python -m benchmarks.segmentation_study fit --tasks sky")
    assert [line.split(" | ")[:2] for line in fitted.splitlines()[3:]] == [
        ["| baseline", "1"],
        ["| group DRO", "1"],
    ]
    # its test column is the trainer's own test evaluation of the selected epoch
    run = tmp_path / "runs" / "sky-32x48-baseline-seed0"
    (epoch,) = json.loads((run / "metrics.json").read_text())["history"]
    again = split_summary(run, tmp_path / "data" / "camvid-sky-32x48", "test")
    assert again["miou"] == pytest.approx(epoch["test_miou"], abs=1e-12)
    assert again["iou"] == pytest.approx(epoch["test_iou"], abs=1e-12)
    shutil.rmtree(tmp_path / "runs")  # a later session: the archived runs count as done
    assert cli.main(["run", *args, "--archive", "kept"]) == 0
    assert "0 of 2 runs to do" in capsys.readouterr().out
    study = text = (tmp_path / "figs" / "segmentation_study.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith(("| baseline", "| group DRO"))]
    assert len(rows) == 2 and all("| 1/1 |" in r for r in rows)
    assert "| ground truth dilated by 1 pixel |" in text  # read against the floor
    assert (tmp_path / "figs" / "segmentation_study.png").stat().st_size > 0
    with pytest.raises(SystemExit):
        cli.main(["run", "--runs", "runs"])  # run without --camvid: a usage error
    # a grid with other settings (2 epochs) does not take the 1-epoch runs for its own
    assert cli.main(["table", *args, "--epochs", "2"]) == 0
    assert "| baseline |" not in (tmp_path / "figs" / "segmentation_study.md").read_text()
    text = timing(2, "sky", (32, 48))
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines()}
    assert set(spec.METHODS) | {"cross-entropy (baseline)"} <= set(rows)
    assert rows["baseline"].endswith("| 1.000 |")
    assert text.count("| fbeta defaults |") == 2  # the step ratio and its own work
    assert text.count("| per-image F-beta |") == 2  # the step ratio and its own work on the pixels
    assert (
        text.count("| per-image F-beta, compiled |") == 1
    )  # its own work as train.compile runs it
    for loss in ("Dice", "Lovasz per image + CE", "focal", "median-frequency CE", "group DRO"):
        assert text.count(f"| {loss} |") == 2  # the step ratio and the task loss's cost
    shutil.rmtree(tmp_path / "data")  # a clone without the cache: the archived floor
    assert cli.main(["table", *args, "--archive", "kept"]) == 0
    assert (tmp_path / "figs" / "segmentation_study.md").read_text() == study
    assert cli.main(["floor", *args, "--archive", "kept"]) == 0  # rebuilds the cache, keeps it
    report = (tmp_path / "figs" / "segmentation_study_floor.md").read_text()
    assert "| sky, 32x48 |" in report and report.startswith("<!-- python -m benchmarks.")


def test_inert_table_reads_regularized_and_plain_runs(tmp_path):
    from benchmarks import segmentation_inert as inert

    grid = inert.jobs(2, 0)
    names = [name for name, _ in grid]
    assert (
        "paper preset (Adam)" in names and "no regularizer, Adam 1e-2 (the paper's step)" in names
    )
    row = {"test_miou": 0.9, "test_shape_fbeta": 0.5}
    reg = {"reg_lambda_mean": 0.03, "reg_eps": 1.48, "reg_mu": -1.0, "reg_inert": "mu moved: x"}
    for name, job in grid[-3:]:  # library defaults, then the two unregularized runs
        extra = reg if name == "library defaults" else {}
        history = [{**row, **extra, "test_miou": 0.8}, {**row, **extra}]
        (tmp_path / job.key).mkdir()
        config: dict = {}
        for override in job.overrides:  # the run's saved config agrees with its job
            key, _, value = override.partition("=")
            *parents, leaf = key.split(".")
            node = config
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = yaml.safe_load(value)
        (tmp_path / job.key / "metrics.json").write_text(
            json.dumps({"history": history, "final": {"epochs": 2}, "config": config})
        )
    lines = inert.table(tmp_path, grid).splitlines()
    assert len(lines) == 2 + 3  # header, rule, the three finished runs
    assert (
        lines[2]
        == "| library defaults | 0.50 0.50 | 0.030 | 1.480 | -1.000 | 0.900; 0.800 | mu moved |"
    )
    assert lines[3] == "| no regularizer, Adam 1e-3 | n/a | n/a | n/a | n/a | 0.900; 0.800 | n/a |"


def test_a_finished_run_counts_only_for_a_job_with_its_settings():
    from benchmarks.sweep import Job, agrees

    config = {"train": {"epochs": 15, "seed": 0}, "regularizer": {"fbeta": {"preset": None}}}
    assert agrees(config, ["train.epochs=15", "train.seed=0", "regularizer.fbeta.preset=null"])
    assert not agrees(config, ["train.epochs=25"])
    assert not agrees(config, ["train.group_weighting=dro"])  # a key the run does not have
    assert Job("k", "c", ("train.epochs=15",)).overrides == ("train.epochs=15",)


def test_a_shorter_run_of_the_job_is_extended_to_the_same_training(tmp_path, digits_smnist):
    """``run_jobs``: a finished run with fewer epochs (otherwise the job's settings, constant lr)
    is resumed to the job's epochs, and equals the run trained for them at once, bit for bit."""
    import json

    from benchmarks.sweep import Job, run_jobs
    from tests.train.run_utils import assert_bitwise_equal
    from train import checkpoint

    base = (
        f"data.path={digits_smnist}",
        "regularizer.name=fbeta",
        "train.seed=3",
        "train.checkpoint=true",
    )
    root = tmp_path / "runs"
    run_jobs([Job("a", "configs/demo.yaml", (*base, "train.epochs=1"))], root, workers=1)
    run_jobs([Job("b", "configs/demo.yaml", (*base, "train.epochs=2"))], root, workers=1)
    first = json.loads((root / "a" / "metrics.json").read_text())["history"][0]
    (root / "a").rename(root / "c")  # the 1-epoch run, extended as job "c" with 2 epochs
    run_jobs([Job("c", "configs/demo.yaml", (*base, "train.epochs=2"))], root, workers=1)
    history = [json.loads((root / k / "metrics.json").read_text())["history"] for k in "bc"]
    assert [len(h) for h in history] == [2, 2]
    assert history[1][0] == first  # epoch 1 was kept (its timings too), not trained again
    b, c = (checkpoint.latest(root / k)[1] for k in "bc")
    assert_bitwise_equal(b["model"], c["model"])
    assert_bitwise_equal(b["regularizer"], c["regularizer"])
    assert_bitwise_equal(b["optimizer"], c["optimizer"])


def test_plateau_reports_block_means_and_the_last_slope():
    from benchmarks.segmentation_study.tables import plateau

    rising = [{"history": [{"val_miou": 0.1 * e} for e in range(10)]}]
    flat = [{"history": [{"val_miou": 0.5} for _ in range(10)]}] * 2
    assert "1-5: 0.200; 6-10: 0.700" in plateau(rising)
    assert "slope over the last 10 epochs +0.1000 ± +0.0000" in plateau(rising)
    assert "+0.0000 ± +0.0000 per epoch" in plateau(flat) and "2 seeds" in plateau(flat)


GPU_RUNS = ROOT / "docs" / "figures" / "segmentation_study_runs" / "gpu"


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out |= _flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v}
    return out


def test_the_shipped_small_object_recipe_is_the_measured_gpu_run():
    """configs/camvid_small_objects.yaml trains what the measured 360x480 baseline (seed 0) of
    resolution_gpu.sh trained, but for its name, the cache's folder and the device left to auto."""
    from train import config as C

    shipped = _flat(C.load(ROOT / "configs" / "camvid_small_objects.yaml").to_dict())
    measured = yaml.safe_load((GPU_RUNS / "all-360x480-baseline-seed0" / "config.yaml").read_text())
    measured = _flat(measured)
    # options added since the measured run count at their defaults (what the run trained with)
    defaults = _flat(C.Config().to_dict())
    differ = {
        k
        for k in shipped.keys() | measured.keys()
        if shipped.get(k) != measured.get(k, defaults.get(k))
    }
    # train.keep_checkpoints: how many step checkpoints stay on disk, not what trains
    assert differ - {"train.keep_checkpoints"} == {
        "experiment",
        "data.path",
        "train.device",
        "train.out",
    }
    assert (shipped["data.path"], measured["data.path"]) == (
        "data/camvid-360x480",
        "data/gpu-camvid-360x480",
    )
    assert (shipped["train.device"], measured["train.device"]) == ("auto", "cuda")


def test_the_resolution_table_in_docs_is_the_archived_gpu_runs(tmp_path):
    """``resolution`` on the archived runs writes docs/figures/segmentation_study_resolution.md as
    it is in the repository."""
    from benchmarks.segmentation_study.resolution import write_resolution

    write_resolution(GPU_RUNS, GPU_RUNS.parent, tmp_path)
    name = "segmentation_study_resolution.md"
    assert (tmp_path / name).read_text() == (ROOT / "docs" / "figures" / name).read_text()


def _fake_run(folder: Path, test_iou: list[float], epochs: int = 2, finished: bool = True) -> None:
    row = {"test_miou": float(sum(test_iou) / len(test_iou)), "test_iou": test_iou}
    row |= {"test_miou_gap": 0.01, "val_miou": 0.5, "epoch": epochs}
    history = [row | {"epoch": e + 1, "train_seconds": 2.0} for e in range(epochs)]
    metrics = {
        "config": {"train": {"epochs": epochs, "device": "cuda"}},
        "final": {"epochs": epochs if finished else epochs - 1},
        "selected": row,
        "history": history,
    }
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps(metrics))


def test_resolution_groups_finished_runs_by_size_and_arm(tmp_path):
    """Each (size, arm) row is the mean over its finished seeds; an unfinished run and a folder of
    another name do not count; the baseline comes first at each size."""
    from benchmarks.segmentation_study.floor import CLASS_NAMES
    from benchmarks.segmentation_study.resolution import gpu_runs, resolution_table

    classes = list(CLASS_NAMES)
    small = [classes.index(c) for c in spec.SMALL_CLASSES]

    def iou(v_small: float) -> list[float]:
        return [v_small if i in small else 0.5 for i in range(len(classes))]

    _fake_run(tmp_path / "all-360x480-baseline-seed0", iou(0.2))
    _fake_run(tmp_path / "all-360x480-baseline-seed1", iou(0.4))
    _fake_run(tmp_path / "all-360x480-baseline-seed2", iou(0.9), finished=False)
    _fake_run(tmp_path / "all-120x160-unet_mfce-seed0", iou(0.1))
    _fake_run(tmp_path / "all-120x160-baseline-seed0", iou(0.05))
    _fake_run(tmp_path / "sky-120x160-baseline-seed0", iou(0.7))
    runs = gpu_runs(tmp_path)
    assert list(runs) == [
        ((120, 160), "baseline"),
        ((120, 160), "U-Net + median-frequency CE"),
        ((360, 480), "baseline"),
    ]
    assert len(runs[((360, 480), "baseline")]) == 2
    text = resolution_table(tmp_path, tmp_path / "no-archive")
    row = next(line for line in text.splitlines() if line.startswith("| GPU | 360x480 | baseline"))
    assert "| 2 |" in row and "| 0.300 ± 0.141 |" in row  # small classes: mean, sd of 0.2 and 0.4
    with pytest.raises(ValueError, match="--runs"):
        gpu_runs(tmp_path / "no-archive")


@pytest.mark.slow  # a small study run end to end (the default suite's time)
def test_resolution_gpu_script_trains_both_arms_that_the_table_reads(tmp_path):
    """resolution_gpu.sh end to end on the CPU (1 epoch, 3 frames, 120x160 only): its runs are the
    folders ``resolution`` reads, trained with the recipe, and its archive of them comes back."""
    import os
    import subprocess
    import sys
    import tarfile

    from benchmarks.segmentation_study.resolution import gpu_runs

    camvid = write_layout(tmp_path / "camvid")
    (tmp_path / "out").mkdir()
    env = os.environ | {
        "OUT": str(tmp_path / "out"),
        "CAMVID": str(camvid),
        "WORK": str(tmp_path),
        "DEV": "cpu",
        "EPOCHS": "1",
        "SEEDS_LO": "0",
        "SEEDS_HI": "",
        "PY": sys.executable,
    }
    script = ROOT / "benchmarks" / "segmentation_study" / "resolution_gpu.sh"
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    runs = gpu_runs(tmp_path / "runs" / "gpu")
    assert list(runs) == [((120, 160), "baseline"), ((120, 160), "U-Net + median-frequency CE")]
    (base,), (unet,) = runs.values()
    for m in (base, unet):
        assert m["config"]["data"]["scale_range"] == [0.5, 2.0]
        assert m["config"]["optim"]["schedule"] == "poly"
    assert unet["config"]["train"]["class_weights"] == "median_frequency"
    assert (unet["config"]["model"]["name"], base["config"]["model"]["name"]) == (
        "unet",
        "deeplabv3plus",
    )
    with tarfile.open(tmp_path / "out" / "runs.tar.gz") as tar:
        assert "runs/gpu/all-120x160-baseline-seed0/metrics.json" in tar.getnames()
