"""Checkpoints that survive a crash at any instant.

Layout: ``<run>/checkpoints/<name>/{tensors.safetensors, state.json}``, plus the *parts* of a
parameter server (``shard-XXX-of-YYY.safetensors``, each written by its shard, wherever that runs);
``state.json`` carries the sha256 of every tensor file and of its own content. A checkpoint is written into a hidden ``.partial-*`` directory, every
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
from typing import Any, Callable

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from cadence.errors import CheckpointError, os_errors

log = logging.getLogger("cadence")

FORMAT = 2  # 2: state.json carries a checksum of itself (STATE_SHA)
LEGACY_FORMAT = 1  # still read: its tensors are verified, its JSON is not
STATE_SHA = "state_sha256"
TENSORS = "tensors.safetensors"
STATE = "state.json"
EPOCH_PATTERN = re.compile(r"^epoch-(\d{6})$")
PARTS, PARTS_DIR = "parts", "parts_dir"  # keys a checkpoint written in parts adds to its state
PartWriter = Callable[[Path], dict[str, str]]


def checkpoint_root(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def epoch_name(epoch: int) -> str:
    return f"epoch-{epoch:06d}"


def save_checkpoint(run_dir: Path, name: str, tensors: dict[str, Tensor], state: dict[str, Any],
                    keep: int | None = None, parts: PartWriter | None = None) -> Path:
    """``parts``: writes further tensor files into the checkpoint's directory (a parameter-server
    shard writes its own rows: nothing passes through this process) and returns {file: sha256};
    each is verified on load like the main file."""
    root = checkpoint_root(run_dir)
    partial = root / f".partial-{name}-{os.getpid()}"
    try:
        with os_errors(root / name, "write the checkpoint"):
            return _save(root, partial, name, tensors, state, keep, parts, run_dir)
    finally:
        shutil.rmtree(partial, ignore_errors=True)  # a failed write leaves nothing (the older ones stay)


def _save(root: Path, partial: Path, name: str, tensors: dict[str, Tensor], state: dict[str, Any],
          keep: int | None, parts: PartWriter | None, run_dir: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    digest = write_tensors(partial / TENSORS, tensors)
    body = {"format": FORMAT, "sha256": digest, "state": state}
    if parts is not None:
        body["parts"] = parts(partial)
    body[STATE_SHA] = _body_digest(body)
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


def write_tensors(path: Path, tensors: dict[str, Tensor]) -> str:
    """One safetensors file, fsynced; returns its sha256."""
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(path))
    _fsync(path)
    return _sha256(path)


def read_tensors(path: Path, sha256: str) -> dict[str, Tensor]:
    """A file written by ``write_tensors``, verified against its checksum."""
    if not path.is_file():
        raise CheckpointError(f"{path}: missing")
    if _sha256(path) != sha256:
        raise CheckpointError(f"{path}: checksum mismatch (the file is corrupt or truncated)")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{path}: unreadable ({err})") from None


def read_tables(state: dict[str, Any]) -> dict[str, Tensor]:
    """``table.keys/values/state`` of a checkpoint whose rows were written in parts (one per
    parameter-server shard), merged and sorted by key."""
    directory = Path(state[PARTS_DIR])
    pieces = [read_tensors(directory / name, sha) for name, sha in sorted(state[PARTS].items())]
    return merge_tables([(p["table.keys"], p["table.values"], p["table.state"]) for p in pieces])


def merge_tables(parts: list[tuple[Tensor, Tensor, Tensor]]) -> dict[str, Tensor]:
    """``table.keys/values/state`` of several shards' (keys, values, state), sorted by key."""
    keys = torch.cat([part[0] for part in parts])
    order = torch.argsort(keys)
    return {"table.keys": keys[order], "table.values": torch.cat([part[1] for part in parts])[order],
            "table.state": torch.cat([part[2] for part in parts])[order]}


def load_checkpoint(path: Path, tables: bool = True) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Verify and load one checkpoint; ``CheckpointError`` says what is wrong with it.

    A checkpoint written in parts lists them in ``state["parts"]`` ({file: sha256}; every one is
    verified here) and its directory in ``state["parts_dir"]``; with ``tables`` the parts' rows are
    merged into the tensors (``table.*``), without, the caller reads them (``read_tables``, or each
    shard its own part)."""
    try:
        body = json.loads((path / STATE).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: {STATE} is missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path / STATE}: unreadable ({err})") from None
    if not isinstance(body, dict) or body.get("format") not in (LEGACY_FORMAT, FORMAT) or "sha256" not in body:
        raise CheckpointError(f"{path / STATE}: not a cadence checkpoint of format {FORMAT}")
    if body["format"] == FORMAT and body.get(STATE_SHA) != _body_digest(body):
        raise CheckpointError(f"{path / STATE}: its checksum does not match (edited or corrupt)")
    if not isinstance(body.get("state"), dict):
        raise CheckpointError(f"{path / STATE}: not a cadence checkpoint of format {FORMAT}")
    tensor_path = path / TENSORS
    if not tensor_path.is_file():
        raise CheckpointError(f"{tensor_path}: missing")
    tensors = read_tensors(tensor_path, body["sha256"])
    state = body["state"]
    parts = body.get("parts")
    if parts:
        for name, sha in parts.items():
            part = path / name
            if not part.is_file() or _sha256(part) != sha:
                raise CheckpointError(f"{part}: missing, or its checksum does not match (corrupt or truncated)")
        state = {**state, PARTS: parts, PARTS_DIR: str(path)}
        if tables:
            tensors.update(read_tables(state))
    return tensors, state


def load_latest(run_dir: Path, tables: bool = True,
                apply: Callable[[dict[str, Tensor], dict[str, Any]], None] | None = None
                ) -> tuple[dict[str, Tensor], dict[str, Any], Path] | None:
    """The newest checkpoint that verifies (and that ``apply`` accepts: a checkpoint whose
    tensors do not fit the run, other shapes or another task, raises there); every one that does
    not is reported and skipped for the one before it."""
    candidates = epoch_checkpoints(run_dir)
    problems = []
    for path in reversed(candidates):
        try:
            tensors, state = load_checkpoint(path, tables)
        except CheckpointError as err:
            log.warning("skipping corrupt checkpoint: %s", err)
            problems.append(str(err))
            continue
        try:
            if apply is not None:
                apply(tensors, state)
        except (KeyError, ValueError, TypeError, RuntimeError) as err:
            log.warning("skipping checkpoint %s: it does not match this run (%s)", path, err)
            problems.append(f"{path}: does not match this run ({err})")
            continue
        return tensors, state, path
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


def _body_digest(body: dict[str, Any]) -> str:
    """sha256 of ``state.json``'s content but its own checksum, in a canonical JSON form."""
    content = {key: value for key, value in body.items() if key != STATE_SHA}
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


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
