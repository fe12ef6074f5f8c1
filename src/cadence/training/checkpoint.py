"""Checkpoints that survive a crash at any instant.

Layout: ``<run>/checkpoints/<name>/{tensors.safetensors, state.json}``; ``state.json`` carries the
sha256 of the tensor file. A checkpoint is written into a hidden ``.partial-*`` directory, every
file is fsynced, and the directory is renamed into place (then the parent fsynced): a reader sees a
whole checkpoint or none. Older checkpoints are pruned only after the new one is in place. Loading
never unpickles (safetensors holds only tensors; the rest is JSON); a checkpoint whose checksum or
JSON does not verify is reported and skipped in favour of the previous one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from cadence.errors import CheckpointError

log = logging.getLogger("cadence")

FORMAT = 1
TENSORS = "tensors.safetensors"
STATE = "state.json"
EPOCH_PATTERN = re.compile(r"^epoch-(\d{6})$")


def checkpoint_root(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def epoch_name(epoch: int) -> str:
    return f"epoch-{epoch:06d}"


def save_checkpoint(run_dir: Path, name: str, tensors: dict[str, Tensor], state: dict[str, Any],
                    keep: int | None = None) -> Path:
    root = checkpoint_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    partial = root / f".partial-{name}-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    tensor_path = partial / TENSORS
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tensor_path))
    _fsync(tensor_path)
    body = {"format": FORMAT, "sha256": _sha256(tensor_path), "state": state}
    state_path = partial / STATE
    state_path.write_text(json.dumps(body, indent=1))
    _fsync(state_path)
    final = root / name
    if final.exists():
        shutil.rmtree(final)
    os.rename(partial, final)
    _fsync(root)
    if keep is not None:
        for old in epoch_checkpoints(run_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def epoch_checkpoints(run_dir: Path) -> list[Path]:
    """Epoch checkpoints, oldest first."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and EPOCH_PATTERN.match(p.name))


def load_checkpoint(path: Path) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Verify and load one checkpoint; ``CheckpointError`` says what is wrong with it."""
    try:
        body = json.loads((path / STATE).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: {STATE} is missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path / STATE}: unreadable ({err})") from None
    if not isinstance(body, dict) or body.get("format") != FORMAT or "sha256" not in body:
        raise CheckpointError(f"{path / STATE}: not a cadence checkpoint of format {FORMAT}")
    tensor_path = path / TENSORS
    if not tensor_path.is_file():
        raise CheckpointError(f"{tensor_path}: missing")
    digest = _sha256(tensor_path)
    if digest != body["sha256"]:
        raise CheckpointError(f"{tensor_path}: checksum mismatch (the file is corrupt or truncated)")
    try:
        tensors = load_file(str(tensor_path))
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{tensor_path}: unreadable ({err})") from None
    return tensors, body["state"]


def load_latest(run_dir: Path) -> tuple[dict[str, Tensor], dict[str, Any], Path] | None:
    """The newest checkpoint that verifies; corrupt ones are reported and skipped."""
    candidates = epoch_checkpoints(run_dir)
    problems = []
    for path in reversed(candidates):
        try:
            tensors, state = load_checkpoint(path)
            return tensors, state, path
        except CheckpointError as err:
            log.warning("skipping corrupt checkpoint: %s", err)
            problems.append(str(err))
    if problems:
        raise CheckpointError("no usable checkpoint: " + "; ".join(problems))
    return None


def flatten_optimizer(optimizer: torch.optim.Optimizer) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Split an optimizer's state_dict into tensors (for safetensors) and JSON."""
    state_dict = optimizer.state_dict()
    tensors: dict[str, Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for param_id, entries in state_dict["state"].items():
        for key, value in entries.items():
            if isinstance(value, Tensor):
                tensors[f"optimizer.{param_id}.{key}"] = value
            else:
                scalars.setdefault(str(param_id), {})[key] = value
    return tensors, {"param_groups": state_dict["param_groups"], "scalars": scalars}


def restore_optimizer(optimizer: torch.optim.Optimizer, tensors: dict[str, Tensor], meta: dict[str, Any]) -> None:
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        if name.startswith("optimizer."):
            _, param_id, key = name.split(".", 2)
            state.setdefault(int(param_id), {})[key] = value
    for param_id, entries in meta["scalars"].items():
        state.setdefault(int(param_id), {}).update(entries)
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
