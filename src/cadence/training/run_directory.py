"""The files a run leaves in its ``--out`` directory (a public contract; see docs/outputs.md).

- ``config.yaml``: the resolved configuration (loads back to the same ``Config``);
- ``metrics.jsonl``: one JSON object per evaluation: ``epoch``, ``split``, ``wall_seconds``
  (training time so far, evaluation excluded), ``examples_seen``, and the metrics;
- ``summary.json``: ``strategy``, ``dataset``, ``model``, ``epochs``, ``train_seconds``,
  ``examples_per_second``, ``train_loss`` and the final test metrics (``mrr``, ``hits@1``, ``hits@3``, ``hits@10``);
- ``entity_ids.tsv`` / ``relation_ids.tsv``: id maps of named datasets;
- ``checkpoints/``: see ``cadence.core.checkpoint``.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from cadence.config import Config, load_config
from cadence.errors import CadenceError, os_errors

CONFIG = "config.yaml"
LOCK = ".lock"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"


class RunDirectory:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    @property
    def config_path(self) -> Path:
        return self.path / CONFIG

    def has_run(self) -> bool:
        return self.config_path.exists() or (self.path / "checkpoints").exists()

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the run directory for this process: one writer at a time. An advisory lock
        (``flock``) on ``.lock`` in it, released by the kernel when the process ends however it
        ends, so a crash leaves nothing to clean up; the file names the holder's pid."""
        if self.path.exists() and not self.path.is_dir():
            raise CadenceError(f"{self.path}: is a file; --out must name a directory for the run")
        made = not self.path.exists()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            handle = open(self.path / LOCK, "a+")
        except OSError as err:
            raise CadenceError(f"{self.path}: cannot use it as a run directory ({err.strerror})") from None
        try:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip() or "?"
                raise CadenceError(f"{self.path}: another cadence process (pid {holder}) is writing this run; "
                                   "wait for it to finish, or use another --out") from None
            handle.seek(0)
            handle.truncate()
            handle.write(str(os.getpid()))
            handle.flush()
            self.remove_temporaries()
            yield
        except BaseException:
            if made and [p.name for p in self.path.iterdir()] == [LOCK]:  # a run that never began
                shutil.rmtree(self.path, ignore_errors=True)
            raise
        finally:
            handle.close()  # releases the lock

    def remove_temporaries(self) -> None:
        """What a process killed mid-write left (a ``.partial-*`` checkpoint, a ``.NAME.PID.tmp``
        file): called holding the lock, so no live writer owns them."""
        for leftover in [*self.path.glob(".*.tmp"), *(self.path / "checkpoints").glob(".partial-*")]:
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)

    def check_empty(self, overwrite: bool) -> None:
        """Whether a new run may go here: an empty directory, or ``overwrite``."""
        if self.path.exists() and any(p.name != LOCK for p in self.path.iterdir()) and not overwrite:
            raise CadenceError(
                f"{self.path}: the run directory is not empty; use --resume to continue the run in "
                "it, --overwrite to replace it, or another --out"
            )

    def create(self, config: Config, overwrite: bool = False) -> None:
        """Write the new run's config; with ``overwrite``, the old run's files go now. The caller
        has called ``check_empty`` first, and calls this once everything that can fail before
        training has succeeded (the runtime may have made its store files here meanwhile)."""
        if overwrite and self.path.exists():
            for name in (CONFIG, METRICS, SUMMARY):
                (self.path / name).unlink(missing_ok=True)
            shutil.rmtree(self.path / "checkpoints", ignore_errors=True)
        self.path.mkdir(parents=True, exist_ok=True)
        write_atomic(self.config_path, config.to_yaml())

    def load_config(self) -> Config:
        if not self.config_path.is_file():
            raise CadenceError(f"{self.path}: not a cadence run directory (no {CONFIG})")
        if not any(line.strip() and not line.lstrip().startswith(b"#")
                   for line in self.config_path.read_bytes().splitlines()):
            # (read as every default, it would be another run's config: the default data set's)
            raise CadenceError(f"{self.config_path}: empty; a run's {CONFIG} holds its settings (damaged, or "
                               "not written by cadence)")
        return load_config(self.config_path)

    def write_metrics(self, records: list[dict[str, Any]]) -> None:
        write_atomic(self.path / METRICS, "".join(json.dumps(finite(r), allow_nan=False) + "\n" for r in records))

    def read_metrics(self) -> list[dict[str, Any]]:
        path = self.path / METRICS
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_atomic(self.path / SUMMARY, json.dumps(finite(summary), indent=2, allow_nan=False) + "\n")

    def read_summary(self) -> dict[str, Any]:
        return json.loads((self.path / SUMMARY).read_text())


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinity (an undefined metric: AUC of one class) as ``None``:
    JSON has no NaN, and a reader's parser would reject the file."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def default_run_dir(dataset: str, model: str, strategy: str) -> str:
    """``runs/<dataset>-<model>-<strategy>-<time>``: where a run goes when ``out`` is not set."""
    return str(Path("runs") / f"{dataset}-{model}-{strategy}-{time.strftime('%Y%m%d-%H%M%S')}")


def write_atomic(path: Path, text: str) -> None:
    """Write a whole file or nothing: temporary file, fsync, rename."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with os_errors(path, "write"):
            with open(temporary, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
