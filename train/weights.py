"""Pretrained weights of the segmentation encoders: local files, downloads, and failing fast offline.

``encoder_weights`` names a local ``.pth``/``.pt``/``.safetensors`` file (read on the CPU, loaded
strictly: a mismatch is a ``ValueError`` naming the file) or weights to download (smp and timm: the
Hugging Face Hub; SegNet: torchvision's URL, cached under the torch hub folder). Before a download
a TCP probe (:func:`_reachable`, ``PROBE_TIMEOUT_S``) checks the route to the server: without one
the Hugging Face client runs offline (cached files load, missing ones fail at once) and a missing
torchvision file fails at once, both with a ``RuntimeError`` that says how to fix it
(:func:`_download_help`), instead of the clients' retries.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

import huggingface_hub.constants as hf_constants
import torch
from safetensors.torch import load_file
from torch import Tensor, nn

if TYPE_CHECKING:
    from torchvision.models import WeightsEnum

WEIGHT_FILE_SUFFIXES = (".pth", ".pt", ".safetensors")
PROBE_TIMEOUT_S = 3.0


def _weights_file(weights: object) -> Path | None:
    """The local weights file named by ``encoder_weights``, else ``None`` (a name or ``None``)."""
    if weights is None:
        return None
    if not isinstance(weights, (str, os.PathLike)):
        raise ValueError(f"encoder_weights must be None, a name or a path, got {weights!r}")
    path = Path(weights)
    if path.suffix.lower() in WEIGHT_FILE_SUFFIXES:
        if not path.is_file():
            raise ValueError(f"encoder_weights file {str(path)!r} does not exist")
        return path
    if path.is_file():
        raise ValueError(
            f"encoder_weights file {str(path)!r} must end in one of {WEIGHT_FILE_SUFFIXES}"
        )
    return None


def _read_state_dict(path: Path) -> dict[str, Tensor]:
    try:
        if path.suffix.lower() == ".safetensors":
            state = load_file(path, device="cpu")
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # corrupt or foreign file: say which one
        raise ValueError(f"could not read a state dict from {str(path)!r}: {e}") from e
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise ValueError(
            f"{str(path)!r} must hold a state dict (name -> tensor), got {type(state).__name__}"
        )
    return state


def _load_encoder_file(encoder: nn.Module, path, name: str, state=None) -> None:
    """Strict ``load_state_dict`` into the encoder; a mismatch is a ``ValueError`` naming the file."""
    state = _read_state_dict(path) if state is None else state
    try:
        encoder.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise ValueError(
            f"encoder_weights {str(path)!r} do not match the {name!r} encoder as built "
            f"(in_channels included): {e}"
        ) from e


def _torchvision_state_dict(weights: WeightsEnum) -> dict[str, Tensor]:
    """The weights' state dict from the torch hub cache, or downloaded; fails fast offline."""
    url = weights.url
    cached = Path(torch.hub.get_dir()) / "checkpoints" / Path(urllib.parse.urlsplit(url).path).name
    offline = not cached.is_file() and not _reachable(url)
    if offline:
        raise RuntimeError(_download_help(f"torchvision {weights}", f"{url} unreachable", True))
    try:
        return weights.get_state_dict(progress=False)
    except OSError as e:  # urllib's URLError / HTTPError included
        raise RuntimeError(_download_help(f"torchvision {weights}", e, False)) from e


def _reachable(url: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a TCP connection to ``url``'s host (or the HTTPS proxy in the environment) opens
    within ``timeout`` seconds, name lookup included (in a thread: lookups ignore timeouts)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    proxy = urllib.request.getproxies().get(parts.scheme)
    if proxy and not urllib.request.proxy_bypass(host):
        parts = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    result: list[bool] = []
    done = threading.Event()

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout).close()
            result.append(True)
        except OSError:
            pass
        done.set()

    threading.Thread(target=connect, daemon=True).start()
    return done.wait(timeout) and bool(result)


def _download_help(what: str, cause: object, offline: bool) -> str:
    reason = "no network route to the server" if offline else "the download failed"
    return (
        f"could not get the pretrained weights {what}: {reason} ({cause}). To fix: train from "
        "scratch with model.encoder_weights=null; or, on a machine with internet, build the model "
        "once to fill the caches and copy them here (smp and timm weights: the Hugging Face cache, "
        "$HF_HOME/hub, default ~/.cache/huggingface/hub; torchvision weights: "
        "$TORCH_HOME/hub/checkpoints, default ~/.cache/torch/hub/checkpoints), set HF_HOME / "
        "TORCH_HOME to where they are and HF_HUB_OFFLINE=1; or pass the path of a local "
        f"{'/'.join(WEIGHT_FILE_SUFFIXES)} file with the encoder's state dict as encoder_weights."
    )


@contextlib.contextmanager
def _hub_offline(offline: bool):
    old = hf_constants.HF_HUB_OFFLINE  # read by huggingface_hub.is_offline_mode() at each call
    hf_constants.HF_HUB_OFFLINE = old or offline
    try:
        yield
    finally:
        hf_constants.HF_HUB_OFFLINE = old
