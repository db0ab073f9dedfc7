"""What the segmentation study compares: its tasks and sizes, methods (arms), and the grid of
(task, method, seed) runs. The package's base: ``timing``, ``floor``, ``tables`` and the CLI import
it, it imports none of them."""

from __future__ import annotations

from ..sweep import Job

TASKS = {  # task -> (config, cache prefix, data_prep.camvid task, epochs)
    # epochs: where the baseline's val mIoU has levelled off at 60x80 (the figure's left panels)
    "sky": ("configs/camvid_sky.yaml", "data/camvid-sky", "sky", 15),
    "all": ("configs/camvid.yaml", "data/camvid", "all", 40),
}
# method -> overrides: the same data, seeds, epochs and model for every method; one setting each
METHODS = {
    "baseline": (),
    "fbeta defaults": ("regularizer.name=fbeta", "regularizer.fbeta.preset=null"),
    "fbeta paper + lambda_init 1, capped": (
        "regularizer.name=fbeta",
        "regularizer.fbeta.preset=paper",
        "regularizer.fbeta.lambda_init=1.0",
        "regularizer.fbeta.cap_scores=true",
    ),
    "roc_auc": ("regularizer.name=roc_auc",),
    "soft-F1": ("regularizer.name=soft_fbeta",),
    "group-balanced": ("train.group_weighting=balanced",),
    "group DRO": ("train.group_weighting=dro",),  # Sagawa et al.'s step 0.01 (train.dro_step)
    # the losses a segmentation user reaches for (smp's), the project's per-image F-beta
    # on the pixels, and a full-resolution decoder; each at the weight 1 a loss term gets
    "Dice": ("train.loss=dice",),
    "Lovasz per image": ("train.loss=lovasz", "train.loss_per_image=true"),
    "Lovasz per image + CE": (
        "train.loss=lovasz",
        "train.loss_per_image=true",
        "train.loss_ce_weight=1.0",
    ),
    "focal": ("train.loss=focal",),
    "median-frequency CE": ("train.class_weights=median_frequency",),
    "per-image F-beta": (  # the defaults' sparse tau (sparse_adam_ahead, tracked)
        "regularizer.name=fbeta",
        "regularizer.target=pixels",
        "regularizer.alpha=1.0",
        "regularizer.fbeta.preset=null",
        "regularizer.fbeta.tau_update=sparse_adam_ahead",
    ),
    "U-Net": ("model.name=unet",),
    # what moved something in the 60x80 screening (median-frequency CE: the small classes; Lovasz
    # per image + CE: mIoU; docs/segmentation/small-objects.md), each with the full-resolution decoder
    "U-Net + median-frequency CE": ("model.name=unet", "train.class_weights=median_frequency"),
    "U-Net + Lovasz per image + CE": (
        "model.name=unet",
        "train.loss=lovasz",
        "train.loss_per_image=true",
        "train.loss_ce_weight=1.0",
    ),
}
# a method's settings that depend on the task: on the 11 classes, the per-image F-beta scores every
# class of every image (a macro F-beta over the (class, image) pairs), not the default one class
TASK_OVERRIDES = {
    ("all", "per-image F-beta"): ("regularizer.fbeta.positive_classes=[0,1,2,3,4,5,6,7,8,9,10]",),
}
SIZES = ((60, 80), (120, 160))  # (H, W) of the caches the study trains at
# the 11-class task at 120x160 gets a from-scratch recipe strong enough to segment small things:
# scale jitter [0.5, 2] then a crop back to 120x160 (mmsegmentation's ratio range), the poly
# schedule (lr (1 - step / steps)^0.9), and more epochs -> (overrides, epochs)
RECIPES = {
    ("all", (120, 160)): (("data.scale_range=[0.5,2.0]", "optim.schedule=poly"), 40),
}
# CamVid's small-object classes: the mean of their test IoU is the study's small-object figure
SMALL_CLASSES = ("pole", "sign_symbol", "pedestrian", "bicyclist")
# the arms of the screening at 60x80 (the first grid's best two for reference: the
# F-beta defaults on the shape node and group DRO, run in that grid)
SCREEN = (
    "Dice",
    "Lovasz per image",
    "Lovasz per image + CE",
    "focal",
    "median-frequency CE",
    "per-image F-beta",
    "U-Net",
)


def cache(task: str, size: tuple[int, int]) -> str:
    """The cache folder of ``task`` at ``size`` (H, W)."""
    return f"{TASKS[task][1]}-{size[0]}x{size[1]}"


def method_overrides(task: str, method: str, size: tuple[int, int]) -> tuple[str, ...]:
    """The config overrides that make ``method`` on ``task`` at ``size``: the size's recipe, the
    method's, the task's settings of the method, the cache (what a run and a timing both train)."""
    recipe = RECIPES.get((task, size), ((), None))[0]
    extra = TASK_OVERRIDES.get((task, method), ())
    return (*recipe, *METHODS[method], *extra, f"data.path={cache(task, size)}")


def jobs(
    epochs: int | None,
    seeds: list[int],
    tasks: list[str],
    methods: list[str],
    size: tuple[int, int] = (60, 80),
) -> list[tuple[str, str, Job]]:
    """``(task, method, job)`` of every run of the grid, task by task and seed by seed (an
    interrupted sweep has every method at the first seeds of the first task)."""
    out = []
    for task in tasks:
        config, _, _, task_epochs = TASKS[task]
        task_epochs = RECIPES.get((task, size), ((), task_epochs))[1]
        for seed in seeds:
            for method in methods:
                name = method.replace(" ", "_").replace(",", "")
                # 60x80, the first study's size, keeps its keys (its archived runs)
                at = "" if size == (60, 80) else f"{size[0]}x{size[1]}-"
                key = f"{task}-{at}{name}-seed{seed}"
                overrides = (
                    *method_overrides(task, method, size),
                    f"train.epochs={epochs or task_epochs}",
                    f"train.seed={seed}",
                )
                out.append((task, method, Job(key, config, overrides)))
    return out
