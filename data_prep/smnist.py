"""Build S-MNIST: MNIST with a rescaled copy of its digits, so foreground sizes are bimodal (docs/method/shape-labels.md sec. 6).

Every source digit appears at its original size centred on a ``canvas x canvas`` image, and a
``fraction`` of them a second time, rescaled by ``factor`` (linear) and centred on the same canvas.
Both copies keep the digit label. Per image:

* ``size`` = ``s'`` = the number of pixels ``> pixel_threshold`` (docs/method/shape-labels.md sec. 6: "count of non-zero
  pixels" is ``pixel_threshold = 0``);
* ``shape`` = ``s = 1[s' > t]`` with ``t`` = the mean of the *training* ``s'`` (the test split uses
  the training threshold).

Sources: the four official MNIST files (``--mnist-dir``, gz or raw, md5-checked), ``--download``
(torchvision, needs internet), or ``--source digits`` (scikit-learn's bundled 8x8 digits, upscaled
to a 20x20 box centred in 28x28 like MNIST's: a small offline variant for demos and tests).

Output folder: ``smnist.npz`` (per split: ``{split}_images`` uint8 ``(N, canvas, canvas)``,
``{split}_labels``, ``{split}_size``, ``{split}_shape``, ``{split}_source_index`` (index in the
source split), ``{split}_rescaled`` (0 original, 1 copy)), ``meta.json`` (counts, threshold, input
md5s, options, the npz's sha256 and size) and ``size_histograms.png`` (the paper's Figure 5).
The npz is written under a temporary name and renamed; ``meta.json`` is written last, the same way,
so a folder without it is incomplete and is rebuilt. Identical options give identical bytes.

    python -m data_prep.smnist --mnist-dir data/mnist --out data/smnist
    python -m data_prep.smnist --source digits --out data/smnist-digits
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import json
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from train.caches.smnist import (
    FORMAT_VERSION,
    META_NAME,
    NPZ_NAME,
    PLOT_NAME,
    SPLITS,
)
from train.caches.smnist import is_complete as _is_complete
from train.caches.smnist import (
    load as load,  # re-exported: build, then read with the same module
)
from train.files import atomic_path, file_digest, write_npz
from train.torchvision_compat import ensure_torchvision_importable

INTERPOLATIONS = ("nearest", "bilinear", "bicubic")

# Official MNIST files: md5 of the .gz (published) and of the decompressed idx file.
MNIST_FILES = {
    ("train", "images"): "train-images-idx3-ubyte",
    ("train", "labels"): "train-labels-idx1-ubyte",
    ("test", "images"): "t10k-images-idx3-ubyte",
    ("test", "labels"): "t10k-labels-idx1-ubyte",
}
MNIST_MD5 = {
    "train-images-idx3-ubyte": (
        "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "6bbc9ace898e44ae57da46a324031adb",
    ),
    "train-labels-idx1-ubyte": (
        "d53e105ee54ea40749a09fcbcd1e9432",
        "a25bea736e30d166cdddb491f175f624",
    ),
    "t10k-images-idx3-ubyte": (
        "9fb629c4189551a2d022fa330f9573f3",
        "2646ac647ad5339dbf082846283269ea",
    ),
    "t10k-labels-idx1-ubyte": (
        "ec29112dd5afa0611ce80d1b7f02629c",
        "27ae3e4e09519cfbb04c329615203637",
    ),
}


@dataclass(frozen=True)
class Options:
    """Everything that determines the output bytes (saved in ``meta.json``)."""

    source: str = "mnist"  # "mnist" | "digits"
    canvas: int = 56
    factor: float = 2.0
    fraction: float = 1.0  # fraction of digits that get a rescaled copy
    interpolation: str = "bilinear"
    pixel_threshold: int = 0
    limit: int | None = None  # use only the first `limit` source digits of each split
    seed: int = 0

    def validate(self) -> None:
        def bad(name: str, expected: str) -> ValueError:
            return ValueError(f"{name} must be {expected}, got {getattr(self, name)!r}")

        if self.source not in ("mnist", "digits"):
            raise bad("source", "'mnist' or 'digits'")
        if not isinstance(self.canvas, int) or self.canvas < 28:
            raise bad("canvas", "an integer >= 28 (the source digits are 28x28)")
        if not (0 < self.factor <= 16):
            raise bad("factor", "a number in (0, 16]")
        if not (0 <= self.fraction <= 1):
            raise bad("fraction", "a number in [0, 1]")
        if self.interpolation not in INTERPOLATIONS:
            raise bad("interpolation", f"one of {INTERPOLATIONS}")
        if not (0 <= self.pixel_threshold < 255):
            raise bad("pixel_threshold", "an integer in [0, 255)")
        if self.limit is not None and self.limit < 1:
            raise bad("limit", "None or an integer >= 1")


# --- sources --------------------------------------------------------------------------------------


def find_mnist_files(mnist_dir: Path, verify: bool = True) -> dict[str, tuple[Path, str]]:
    """Locate the four official files (``.gz`` or raw) and check their md5 (``verify=False``:
    files in the official names and format but other contents, e.g. a test's stand-in).

    Returns ``{name: (path, md5)}``. Raises ``FileNotFoundError`` listing what was expected, or
    ``ValueError`` naming the file whose checksum does not match.
    """
    mnist_dir = Path(mnist_dir)
    found, missing = {}, []
    for name, (md5_gz, md5_raw) in MNIST_MD5.items():
        gz, raw = mnist_dir / f"{name}.gz", mnist_dir / name
        path, expected = (gz, md5_gz) if gz.is_file() else (raw, md5_raw)
        if not path.is_file():
            missing.append(name)
            continue
        digest = file_digest(path)
        if verify and digest != expected:
            raise ValueError(
                f"{path}: md5 {digest} does not match the official MNIST file "
                f"(expected {expected}); re-download it (e.g. with --download)"
            )
        found[name] = (path, digest)
    if missing:
        expected = ", ".join(f"{n}[.gz]" for n in MNIST_MD5)
        raise FileNotFoundError(
            f"--mnist-dir {mnist_dir}: missing {', '.join(missing)}; expected the four official "
            f"MNIST files: {expected} (or pass --download, or --source digits for the offline variant)"
        )
    return found


def load_mnist(
    mnist_dir: Path, verify: bool = True
) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], dict[str, str]]:
    """``({split: (images uint8 (N, 28, 28), labels int64 (N,))}, {file: md5})``.

    Parsing is torchvision's (``read_image_file`` / ``read_label_file`` check the idx magic
    numbers); ``.gz`` files are decompressed to a temporary folder first. ``verify``: as for
    :func:`find_mnist_files`.
    """
    ensure_torchvision_importable()
    from torchvision.datasets.mnist import read_image_file, read_label_file

    files = find_mnist_files(mnist_dir, verify)
    data: dict[str, dict[str, np.ndarray]] = {s: {} for s in SPLITS}
    with tempfile.TemporaryDirectory() as tmp:
        for (split, kind), name in MNIST_FILES.items():
            path = files[name][0]
            if path.suffix == ".gz":
                raw = Path(tmp) / name
                with gzip.open(path, "rb") as src, open(raw, "wb") as dst:
                    dst.write(src.read())
                path = raw
            reader = read_image_file if kind == "images" else read_label_file
            data[split][kind] = reader(str(path)).numpy()
    md5s = {(p.name): digest for p, digest in files.values()}
    return {s: (d["images"], d["labels"].astype(np.int64)) for s, d in data.items()}, md5s


def download_mnist(root: Path) -> Path:
    """Download the official files with torchvision (verifies md5); returns their folder."""
    ensure_torchvision_importable()
    from torchvision.datasets import MNIST

    for train in (True, False):
        MNIST(str(root), train=train, download=True)
    return Path(root) / "MNIST" / "raw"


def load_digits_source(
    seed: int,
) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], dict[str, str]]:
    """scikit-learn's 1797 8x8 digits (values 0..16), upscaled to 20x20 and centred in 28x28.

    Split 80/20 into train/test with a permutation drawn from ``seed``.
    """
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:  # pragma: no cover - dev extra missing
        raise ImportError(
            "--source digits needs scikit-learn: pip install -c constraints.txt -e '.[dev]'"
        ) from e
    digits = load_digits()
    x = np.rint(digits.images * (255.0 / 16.0)).astype(np.uint8)  # (N, 8, 8)
    x = np.pad(_resize(x, 20, "bilinear"), ((0, 0), (4, 4), (4, 4)))
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    n_train = round(0.8 * len(y))
    train, test = np.sort(order[:n_train]), np.sort(order[n_train:])
    md5 = hashlib.md5(digits.images.astype("<f8").tobytes()).hexdigest()
    return {"train": (x[train], y[train]), "test": (x[test], y[test])}, {"sklearn_digits": md5}


# --- construction ---------------------------------------------------------------------------------


def _resize(images: np.ndarray, size: int, interpolation: str) -> np.ndarray:
    """Resize a uint8 stack ``(N, h, w)`` to ``(N, size, size)`` with torchvision (antialiased)."""
    ensure_torchvision_importable()
    import torch
    from torchvision.transforms.v2 import InterpolationMode
    from torchvision.transforms.v2 import functional as TF

    mode = {
        "nearest": InterpolationMode.NEAREST,
        "bilinear": InterpolationMode.BILINEAR,
        "bicubic": InterpolationMode.BICUBIC,
    }[interpolation]
    t = torch.from_numpy(np.ascontiguousarray(images)).unsqueeze(1)
    out = TF.resize(
        t, [size, size], interpolation=mode, antialias=mode != InterpolationMode.NEAREST
    )
    return out.squeeze(1).numpy()


def place_centred(images: np.ndarray, canvas: int) -> np.ndarray:
    """Centre ``(N, h, w)`` images on a zero ``canvas x canvas`` (centre-cropped if larger)."""
    n, h, w = images.shape
    out = np.zeros((n, canvas, canvas), dtype=images.dtype)
    # source window (crop) and destination window (pad), per axis
    sy, dy = max(0, (h - canvas) // 2), max(0, (canvas - h) // 2)
    sx, dx = max(0, (w - canvas) // 2), max(0, (canvas - w) // 2)
    hh, ww = min(h, canvas), min(w, canvas)
    out[:, dy : dy + hh, dx : dx + ww] = images[:, sy : sy + hh, sx : sx + ww]
    return out


def build_split(
    images: np.ndarray, labels: np.ndarray, options: Options, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Originals centred on the canvas, then the rescaled copies of a random ``fraction``."""
    n, side = images.shape[0], images.shape[1]
    n_copies = round(options.fraction * n)
    chosen = np.sort(rng.choice(n, size=n_copies, replace=False)) if n_copies else np.zeros(0, int)
    scaled_side = max(1, round(side * options.factor))
    copies = _resize(images[chosen], scaled_side, options.interpolation)
    stack = np.concatenate(
        [place_centred(images, options.canvas), place_centred(copies, options.canvas)]
    )
    return {
        "images": stack,
        "labels": np.concatenate([labels, labels[chosen]]).astype(np.int64),
        "size": (stack > options.pixel_threshold).sum(axis=(1, 2)).astype(np.int64),
        "source_index": np.concatenate([np.arange(n), chosen]).astype(np.int64),
        "rescaled": np.concatenate([np.zeros(n, np.uint8), np.ones(n_copies, np.uint8)]),
    }


def build(
    source: dict[str, tuple[np.ndarray, np.ndarray]], options: Options
) -> tuple[dict[str, dict[str, np.ndarray]], float]:
    """Both splits plus shape labels; returns ``(splits, threshold)``."""
    options.validate()
    rng = np.random.default_rng(options.seed)
    splits = {}
    for split in SPLITS:
        images, labels = source[split]
        if options.limit is not None:
            images, labels = images[: options.limit], labels[: options.limit]
        splits[split] = build_split(images, labels, options, rng)
    threshold = float(splits["train"]["size"].mean())
    for split in SPLITS:
        splits[split]["shape"] = (splits[split]["size"] > threshold).astype(np.int64)
    return splits, threshold


# --- writing --------------------------------------------------------------------------------------


def _counts(split: dict[str, np.ndarray]) -> dict[str, object]:
    labels, shape = split["labels"], split["shape"]
    return {
        "images": int(labels.size),
        "rescaled_copies": int(split["rescaled"].sum()),
        "per_digit": {str(d): int((labels == d).sum()) for d in range(10)},
        "per_shape": {str(s): int((shape == s).sum()) for s in (0, 1)},
        "per_digit_and_shape": {
            str(d): [int(((labels == d) & (shape == s)).sum()) for s in (0, 1)] for d in range(10)
        },
        "size_mean": float(split["size"].mean()),
        "size_min": int(split["size"].min()),
        "size_max": int(split["size"].max()),
    }


def plot_histograms(path: Path, splits: dict[str, dict[str, np.ndarray]], threshold: float) -> None:
    """Per-digit histograms of the training ``s'`` with the threshold (the paper's Figure 5)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = splits["train"]
    fig, axes = plt.subplots(2, 5, figsize=(14, 5.5), sharex=True)
    bins = np.linspace(0, train["size"].max() + 1, 60)
    for d, ax in enumerate(axes.flat):
        ax.hist(train["size"][train["labels"] == d], bins=bins, color="tab:blue")
        ax.axvline(threshold, color="tab:red", lw=1)
        ax.set_title(f"digit {d}")
    fig.supxlabel("foreground size s' (pixels); red: threshold = training mean")
    fig.suptitle("S-MNIST training set: foreground size per digit")
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=90, metadata={"Software": None})
    plt.close(fig)


def is_complete(out: Path, options: Options | None = None) -> bool:
    """True if ``out`` holds a finished build (of ``options``, when given)."""
    return _is_complete(out, None if options is None else asdict(options))


def prepare(
    out: Path,
    options: Options,
    *,
    mnist_dir: Path | None = None,
    download_root: Path | None = None,
    force: bool = False,
    log=print,
) -> dict[str, object]:
    """Build S-MNIST into ``out`` (skipped if a complete build of the same options is there).

    Returns the metadata written to ``meta.json``.
    """
    options.validate()
    out = Path(out)
    if not force and is_complete(out, options):
        log(f"{out}: complete build with these options found; nothing to do (--force rebuilds)")
        return json.loads((out / META_NAME).read_text())
    if options.source == "digits":
        source, md5s = load_digits_source(options.seed)
    else:
        if download_root is not None:
            mnist_dir = download_mnist(download_root)
        if mnist_dir is None:
            raise ValueError("mnist_dir must be given for source 'mnist' (or download_root)")
        source, md5s = load_mnist(mnist_dir)
    splits, threshold = build(source, options)

    out.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        (out / META_NAME).unlink()  # from now on the folder is incomplete until meta is back
    arrays = {f"{s}_{k}": v for s in SPLITS for k, v in splits[s].items()}
    with atomic_path(out / NPZ_NAME) as tmp:
        write_npz(tmp, arrays)
    with atomic_path(out / PLOT_NAME) as tmp:
        plot_histograms(tmp, splits, threshold)
    meta = {
        "format_version": FORMAT_VERSION,
        "dataset": "S-MNIST",
        "options": asdict(options),
        "threshold": threshold,
        "threshold_rule": "shape = 1[size > threshold], threshold = mean training size",
        "size_rule": f"size = number of pixels > {options.pixel_threshold}",
        "image_shape": [options.canvas, options.canvas],
        "inputs_md5": md5s,
        "counts": {s: _counts(splits[s]) for s in SPLITS},
        "npz": NPZ_NAME,
        "npz_bytes": (out / NPZ_NAME).stat().st_size,
        "npz_sha256": file_digest(out / NPZ_NAME, "sha256"),
    }
    with atomic_path(out / META_NAME) as tmp:
        tmp.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    c = meta["counts"]
    log(
        f"{out / NPZ_NAME}: train {c['train']['images']} / test {c['test']['images']} images "
        f"{options.canvas}x{options.canvas}; threshold {threshold:.1f} px; big fraction "
        f"train {c['train']['per_shape']['1'] / c['train']['images']:.3f}"
    )
    return meta


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m data_prep.smnist", description=__doc__.split("\n\n")[0]
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--mnist-dir", type=Path, help="folder with the four official MNIST files (gz or raw)"
    )
    src.add_argument("--download", action="store_true", help="download MNIST with torchvision")
    src.add_argument(
        "--source",
        choices=("mnist", "digits"),
        default=None,
        help="'digits': scikit-learn's bundled 8x8 digits (offline, small)",
    )
    p.add_argument("--out", type=Path, required=True, help="output folder")
    p.add_argument("--download-root", type=Path, default=Path("data/mnist-download"))
    d = Options()
    p.add_argument("--canvas", type=int, default=d.canvas, help="canvas side (pixels)")
    p.add_argument(
        "--factor", type=float, default=d.factor, help="linear rescale factor of the copies"
    )
    p.add_argument("--fraction", type=float, default=d.fraction, help="fraction of digits copied")
    p.add_argument("--interpolation", choices=INTERPOLATIONS, default=d.interpolation)
    p.add_argument(
        "--pixel-threshold",
        type=int,
        default=d.pixel_threshold,
        help="a pixel is foreground if its value is above this",
    )
    p.add_argument("--limit", type=int, default=None, help="first N source digits per split")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--force", action="store_true", help="rebuild even if a complete build exists")
    a = p.parse_args(argv)
    source = a.source or "mnist"
    if source == "mnist" and a.mnist_dir is None and not a.download:
        p.error("give --mnist-dir DIR, --download, or --source digits")
    options = Options(
        source=source,
        canvas=a.canvas,
        factor=a.factor,
        fraction=a.fraction,
        interpolation=a.interpolation,
        pixel_threshold=a.pixel_threshold,
        limit=a.limit,
        seed=a.seed,
    )
    try:
        prepare(
            a.out,
            options,
            mnist_dir=a.mnist_dir,
            download_root=a.download_root if a.download else None,
            force=a.force,
        )
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
