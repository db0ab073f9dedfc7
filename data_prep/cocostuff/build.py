"""The build: ``prepare`` runs inputs -> shards -> shape labels -> arrays -> ``meta.json`` (last,
atomically); ``is_complete`` tells whether a folder holds a finished cache."""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

from train.caches.segmentation import (
    FORMAT_VERSION,
    IGNORE,
    META_NAME,
    PLOT_NAME,
    SPLITS,
    inspect,
)
from train.files import atomic_path, write_text_atomic

from .assemble import _select, _split_meta, _write_split
from .classes import class_table
from .decode import Job
from .inputs import Inputs, SplitSource, find_inputs, fingerprint, read_split
from .options import Options
from .plot import plot_class_sizes
from .shapes import bin_sizes, majority_shape, size_edges
from .shards import PARTIAL_NAME, _mapper, _process_split, _reset_partial


def is_complete(
    out: str | Path, options: Options | None = None, *, inputs: dict | None = None
) -> bool:
    """True if ``out`` holds a finished cache (built with ``options`` / from ``inputs`` when given).

    ``inputs`` is a ``fingerprint()``; the files' sizes are checked, not their sha256.
    """
    meta, _ = inspect(out)
    if meta is None:
        return False
    if options is not None and meta.get("options") != options.key():
        return False
    return inputs is None or meta.get("inputs") == inputs


def make_jobs(
    split: str, src: SplitSource, inputs: Inputs, options: Options, n_cls: int
) -> list[Job]:
    """One ``Job`` per image of ``src`` (what ``process_image`` needs), in ``src``'s order."""
    maps = inputs.maps[split] if inputs.maps is not None else None
    return [
        Job(
            record=r,
            segments=src.segments[i] if src.segments is not None else None,
            image_path=inputs.images[split] / str(r["file_name"]),
            map_path=maps / f"{Path(str(r['file_name'])).stem}.png" if maps else None,
            size=(int(options.size[0]), int(options.size[1])),
            interpolation=options.interpolation,
            num_classes=n_cls,
        )
        for i, r in enumerate(src.records)
    ]


def _rules(options: Options) -> dict[str, str]:
    if options.sky:
        edges = "the mean" if options.bins == 2 else f"the quantiles k/{options.bins}"
        return {
            "shape_rule": f"s = number of edges s' exceeds; edges = {edges} of the training s'",
            "size_rule": "s' = sky pixels (after resizing)",
        }
    return {
        "shape_rule": "s^c = number of thresholds f_c exceeds, per class c present; s = the most "
        "common s^c, ties -> the smaller bin; no class present -> 0",
        "size_rule": "s' = labelled pixels (after resizing)",
        "fraction_rule": "f_c = pixels of class c / (H * W), unlabelled pixels included",
    }


def prepare(options: Options, *, log: Callable[[str], object] = print) -> Path:
    """Build the cache into ``options.out`` (skipped when complete for these options and inputs)."""
    options.validate()
    out = Path(options.out)
    inputs = find_inputs(options)
    prints = fingerprint(inputs)
    if not options.force and is_complete(out, options, inputs=prints):
        log(f"{out}: complete cache for these options and inputs found; nothing to do")
        return out
    sources = {s: read_split(inputs.annotations[s], options) for s in SPLITS}
    class_ids, class_names = class_table(options, sources["train"].names)

    out.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        (out / META_NAME).unlink()  # from now on the folder is incomplete until meta is back
    key_doc = {"format_version": FORMAT_VERSION, "options": options.key(), "inputs": prints}
    key_doc["shard_size"] = options.shard_size
    key = hashlib.sha256(json.dumps(key_doc, sort_keys=True).encode()).hexdigest()
    partial = out / PARTIAL_NAME
    _reset_partial(partial, key, options.force)
    with _mapper(options.workers) as map_fn:
        shards = {
            s: _process_split(
                s,
                make_jobs(s, sources[s], inputs, options, len(class_ids)),
                partial / s,
                key,
                options.shard_size,
                map_fn,
                log,
            )
            for s in SPLITS
        }

    results = {s: _select(s, shards[s], sources[s].records, options) for s in SPLITS}
    for s in SPLITS:
        for skip in results[s]["skipped"]:
            log(f"{s}: skipped image {skip['image_id']} ({skip['reason']})")
    h, w = options.size
    if options.sky:  # thresholds from the training split only, for both splits
        edges = size_edges(results["train"]["size"], options.bins)
    else:
        edges = list(options.shape_thresholds)
    files = {}
    for s, r in results.items():
        r["shape"] = (
            bin_sizes(r["size"], edges)
            if options.sky
            else majority_shape(r["counts"], h * w, edges)
        )
        r["bins"], r["edges"], r["image_size"] = len(edges) + 1, edges, (h, w)
        files.update(_write_split(out / s, shards[s], r, h * w))
    with atomic_path(out / PLOT_NAME) as tmp:
        plot_class_sizes(tmp, options, results["train"], edges)

    meta = {
        "format_version": FORMAT_VERSION,
        "dataset": "COCO-Stuff 2017",
        "split_names": list(SPLITS),  # reported on val (COCO-Stuff's test labels are not public)
        "setup": options.setup,
        "only": options.only,
        "num_classes": len(class_ids),
        "class_names": class_names,
        "class_ids": class_ids,
        "class_ids_note": "COCO category id per class index; -1 = every other labelled category",
        "ignore_index": IGNORE,
        "image_size": [h, w],
        "options": options.key(),
        "shape_bins": len(edges) + 1,
        "edges": edges,
        **_rules(options),
        "splits": {
            s: _split_meta(r, int((~r["keep"]).sum()) if options.sky else None)
            for s, r in results.items()
        },
        "inputs": prints,
        "input_paths": {
            **{f"annotations/{s}": str(p) for s, p in inputs.annotations.items()},
            **{f"images/{s}": str(p) for s, p in inputs.images.items()},
            **{f"stuffthingmaps/{s}": str(p) for s, p in (inputs.maps or {}).items()},
        },
        "files": files,
    }
    write_text_atomic(json.dumps(meta, indent=2, sort_keys=True) + "\n", out / META_NAME)
    shutil.rmtree(partial, ignore_errors=True)
    sp = meta["splits"]
    log(
        f"{out}: {options.setup}{' / ' + options.only if options.sky else ''}, {len(class_ids)} "
        f"classes, {h}x{w}; train {sp['train']['count']} / val {sp['val']['count']} images "
        f"(skipped {sp['train']['skipped_count']} / {sp['val']['skipped_count']}); shape counts "
        f"train {sp['train']['shape_counts']}; edges {[round(e, 4) for e in edges]}"
    )
    return out
