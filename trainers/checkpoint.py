"""Checkpoints that let a run continue the same trajectory.

One file, ``<checkpoint_dir>/checkpoint.pt``, replaced atomically (temp file + os.replace) at each save. It
holds the model and optimizer states, the step, the curve so far, the open report window's sums and the
config fingerprint. The data order is a function of the step (trainers/data.py), so no sampler state is
needed; the run has no other randomness after init. A finished run's checkpoint is marked ``finished`` and
`train` returns its result without training again.

Loading never runs code from the file: ``torch.load(..., weights_only=True)`` unpickles tensors, containers
and numbers only, plus the types of `SAFE_GLOBALS` (what a checkpoint holds beyond those). A file that
needs anything else (a crafted pickle with a payload) is refused with one line before any of it runs.
"""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path
from typing import Any

import torch

from collapse_hpo.predictors.atomic import atomic_write_path
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.trainers.config import TrainConfig

CHECKPOINT_NAME = "checkpoint.pt"
FORMAT_VERSION = 1
#: Globals a checkpoint may reference beyond tensors, containers and numbers (the weights-only allow-list):
#: the run's metadata records ``torch.__version__``, a `TorchVersion` (a ``str`` subclass, no behaviour on
#: load). Add a type here only with a test that a checkpoint holding it loads.
SAFE_GLOBALS: list[Any] = [torch.torch_version.TorchVersion]

#: Fields that may differ between a run and its resumption: they do not change the trajectory's definition
#: (device and precision change rounding only, like the paper's restart on new hardware).
RESUMABLE_CHANGES = frozenset(
    {
        "device",
        "dtype",
        "compile",
        "threads",
        "checkpoint_dir",
        "checkpoint_every_tokens",
        "report_past_on_resume",
        "fault",
        "val_fractions",
    }
)


def fingerprint(config: TrainConfig) -> dict[str, Any]:
    """The config fields a checkpoint must match to be resumed (all but `RESUMABLE_CHANGES`)."""
    return {k: v for k, v in config.to_dict().items() if k not in RESUMABLE_CHANGES}


def checkpoint_path(checkpoint_dir: str | os.PathLike[str]) -> Path:
    return Path(checkpoint_dir) / CHECKPOINT_NAME


def save_checkpoint(checkpoint_dir: str | os.PathLike[str], state: dict[str, Any]) -> Path:
    """Write ``state`` (plus the format version) to ``checkpoint_dir/checkpoint.pt`` atomically."""
    folder = Path(checkpoint_dir)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / CHECKPOINT_NAME
    with atomic_write_path(target) as tmp:
        torch.save({"format_version": FORMAT_VERSION, **state}, tmp)
    return target


def load_checkpoint(config: TrainConfig) -> dict[str, Any] | None:
    """The checkpoint of ``config.checkpoint_dir``, or None when there is none.

    Raises InputError when the file is unreadable or belongs to a run with a different config (naming the
    fields that differ).
    """
    if config.checkpoint_dir is None:
        return None
    path = checkpoint_path(config.checkpoint_dir)
    if not path.is_file():
        return None
    try:
        with torch.serialization.safe_globals(SAFE_GLOBALS):
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:  # needs a global outside the allow-list: never run it
        text = str(err)
        found = re.search(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) (\S+)", text)
        first = f"global {found.group(1)}" if found else (text.strip().splitlines() or [""])[0][:160]
        raise InputError(
            f"{path}: refused: the file asks to load objects other than tensors and plain values ({first}); "
            "it is not a checkpoint this trainer wrote (loading it could run code): delete it or use another "
            "checkpoint_dir"
        ) from None
    except Exception as err:  # a truncated or foreign file
        raise InputError(
            f"{path}: not a readable trainer checkpoint ({type(err).__name__}); "
            f"delete it or use another checkpoint_dir"
        ) from None
    if not isinstance(state, dict) or state.get("format_version") != FORMAT_VERSION:
        raise InputError(
            f"{path}: not a trainer checkpoint of format {FORMAT_VERSION}; delete it or use "
            f"another checkpoint_dir"
        )
    want, have = fingerprint(config), state.get("fingerprint", {})
    differ = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
    if differ:
        raise InputError(
            f"{path}: checkpoint is from a different run (field(s) {', '.join(differ)} differ); "
            f"use another checkpoint_dir or delete it"
        )
    return state
