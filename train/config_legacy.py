"""Configs written for older versions of the library: options it removed, loaded where they meant
what it does now, and a one-line error naming the key and what to use instead otherwise
(``train.config.from_dict`` calls both before building the config)."""

from __future__ import annotations

from typing import Any

# Option values removed from the library (CHANGELOG.md, 0.3.0) -> what to use instead
RETIRED_OPTIONS: dict[str, dict[str, str]] = {
    "projection": {
        "clip": "use 'tracked' (F-beta's default: the exact projection's threshold at O(B) per "
        "step) or, for a rate objective, 'inline' (its box projection on the batch's rows, O(B))",
        "step": "use regularizer.name=fbeta_full_projections (the paper's full projections after "
        "every optimizer step) or 'epoch'",
        "none": "the ablation without a projection is gone; use 'tracked' (the default), "
        "'epoch' or 'inline'",
    },
    "tau_update": {
        "sparse_adam": "use 'sparse_adam_ahead' (dense Adam's trajectory at O(B) per step; lazy "
        "Adam left a 4.9 % LP gap) or 'dense'",
        "sparse_sgd": "use 'sparse_adam_ahead' (the default's rule), or 'dense' stepped by your "
        "own optimizer (with SGD that is the same step)",
    },
}


# Options removed from the library (the method note, docs/method/, says why) -> the one value they may still have in
# a saved config: with it they meant what the library does now, so they are dropped on loading
# (an older run resumes); any other value is an error naming the key.
REMOVED: dict[str, Any] = {
    "regularizer.rho": 0.0,
    "regularizer.dual_schedule": "constant",
    "regularizer.fbeta.negative_loss": "hinge",
    "regularizer.fbeta.projection_method": "auto",
    "regularizer.fbeta.eps_init": 1.0,
    "regularizer.fbeta.tau_init": 1.0,
    "regularizer.precision_at_recall.tau_init": 1.0,
    "regularizer.recall_at_precision.tau_init": 1.0,
    "regularizer.roc_auc.tau_init": 1.0,
    "regularizer.cooper_fbeta.eps_init": 1.0,
    "regularizer.cooper_fbeta.tau_init": 1.0,
}


def drop_removed(raw: dict[str, Any]) -> None:
    """Drop the ``REMOVED`` options that a config sets to their one remaining meaning."""
    for key, value in REMOVED.items():
        *path, last = key.split(".")
        node: Any = raw
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and last in node:
            if node[last] != value:
                raise ValueError(
                    f"{key}={node[last]!r}: this option was removed from the library (only "
                    f"{value!r}, what it does now, is accepted; the method note, docs/method/, says why)"
                )
            del node[last]


def refuse_retired(raw: dict[str, Any]) -> None:
    """A mode the library no longer has (``RETIRED_OPTIONS``) in any section: one line
    naming the key and what to use instead."""
    sections = raw.get("regularizer")
    if not isinstance(sections, dict):
        return
    for path, node in [("regularizer", sections)] + [
        (f"regularizer.{name}", sub) for name, sub in sections.items() if isinstance(sub, dict)
    ]:
        for option, retired in RETIRED_OPTIONS.items():
            value = node.get(option)
            if isinstance(value, str) and value in retired:
                raise ValueError(
                    f"{path}.{option}={value!r} was removed in version 0.3.0: {retired[value]}"
                )
