"""How a reliability case runs the ``cadence`` command and judges what it did.

A case is a function of a ``Workspace`` (a fresh directory, tiny data for every task, trained runs
on demand) that runs commands and states what a user should see. The rules every error must meet
are in ``Workspace.fails``: the exit code, one ``cadence: error:`` line naming what the user
typed (file and line, flag, key or path), no traceback, nothing partial. A case passes or raises
``AssertionError`` saying which rule it broke.

Commands run in this process (``cadence.cli.main``: fast, for the default suite) or as a real
``python -m cadence.cli`` process, always so for signals, and for everything when the corpus is
counted against another source tree (``python -m tests.reliability.count --src DIR``).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from tests.conftest import random_triples, write_corpus, write_criteo, write_graph, write_images, write_ratings

TASKS = ("kge", "ctr", "mf", "w2v")
BASE = ["--dim", "8", "--epochs", "2", "--batch-size", "32", "--no-progress", "--set", "threads=1"]
TASK_ARGS = {  # data files are filled in by Workspace.data
    "kge": ["--set", "train.negatives=8"],
    "ctr": ["--task", "ctr", "--model", "fm", "--set", "model.init_std=0.1"],
    "mf": ["--task", "mf", "--set", "model.init_std=0.1"],
    "w2v": ["--task", "w2v", "--set", "w2v.min_count=1", "--set", "w2v.sample=0.01", "--lr", "0.05"],
    # (not in TASKS: the text-file cases do not apply to its binary IDX files; the cases that do name it)
    "image": ["--task", "image", "--set", "image.valid_size=40", "--set", "image.hidden=[32]",
              "--set", "optimizer.dense=sgd", "--set", "optimizer.momentum=0.9", "--lr", "0.05"],
}
RUNTIMES = {  # strategy flags of each runtime a case can run under
    "sync": ["--strategy", "sync"],
    "async": ["--strategy", "async"],
    "oac": ["--strategy", "oac"],
    "pdasgd": ["--strategy", "pdasgd", "--set", "pdasgd.backward_threads=2"],
    "adapm": ["--strategy", "adapm", "--workers", "2", "--set", "adapm.lookahead=8"],
    "hop_bw": ["--strategy", "hop_bw", "--workers", "2", "--set", "ps.backup_workers=0"],
    "gba": ["--strategy", "gba", "--workers", "2"],
    "bsp": ["--strategy", "bsp", "--workers", "2"],
    "shadow-ma": ["--strategy", "shadow-ma", "--workers", "2", "--set", "shadow.threads=2"],
    "fr-easgd": ["--strategy", "fr-easgd", "--workers", "2", "--set", "shadow.threads=2"],
    "shadow-ray": ["--strategy", "shadow-ma", "--workers", "2", "--set", "shadow.threads=2", "--engine", "ray"],
    "ray": ["--strategy", "hop_bw", "--workers", "2", "--set", "ps.backup_workers=0", "--engine", "ray"],
    # the tasks' own in-place loops (each for its task alone): word2vec's, Surprise's
    "pair": ["--strategy", "async", "--set", "w2v.update=pair"],
    "rating": ["--strategy", "sync", "--set", "mf.update=rating", "--set", "optimizer.entity=sgd"],
}


class CannotRun(Exception):
    """This machine cannot stage the case (no mount, no capabilities to drop): it is skipped."""


@dataclass
class Result:
    code: int
    out: str
    err: str

    def __str__(self) -> str:
        return f"exit {self.code}\n--- stdout\n{self.out[-2000:]}\n--- stderr\n{self.err[-3000:]}"


@dataclass
class Runner:
    """Runs ``cadence`` argv: in this process, or as a process of ``python`` with ``src`` first on
    its path (another checkout's ``src``, when the corpus is counted against it)."""

    in_process: bool = True
    src: Path | None = None
    python: str = sys.executable

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {**os.environ, **(extra or {})}
        paths = [str(Path(__file__).resolve().parents[2])]  # `tests` is importable for helper scripts
        if self.src is not None:
            paths.insert(0, str(self.src))
        env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")])
        return env

    def command(self, argv: list[str]) -> list[str]:
        return [self.python, "-m", "cadence.cli", *argv]

    def __call__(self, argv: list[str], env: dict[str, str] | None = None, plain_user: bool = False,
                 timeout: float = 600) -> Result:
        if not self.in_process or plain_user:
            return self.process(argv, env, plain_user, timeout)
        from cadence.cli import main

        out, err = io.StringIO(), io.StringIO()
        with _environment(env or {}), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exit_:  # argparse
                code = exit_.code if isinstance(exit_.code, int) else 1
            except BaseException:  # what a user would see: a traceback, exit 1
                traceback.print_exc(file=err)
                code = 1
        return Result(code, out.getvalue(), err.getvalue())

    def process(self, argv: list[str], env: dict[str, str] | None = None, plain_user: bool = False,
                timeout: float = 600) -> Result:
        def prepare() -> None:
            _as_at_a_terminal()
            if plain_user:
                _without_root_access()

        try:
            done = subprocess.run(self.command(argv), capture_output=True, text=True, env=self.env(env),
                                  timeout=timeout, preexec_fn=prepare)
        except subprocess.TimeoutExpired as err:  # (killed: a hang is what the user would see)
            return Result(-9, _text(err.stdout), _text(err.stderr) + f"\n[killed after {timeout:g} s]")
        except subprocess.SubprocessError as err:  # the preexec step failed: no power to drop capabilities
            if plain_user:
                raise CannotRun(f"cannot run as a plain user here ({err})") from None
            raise
        return Result(done.returncode, done.stdout, done.stderr)

    def start(self, argv: list[str]) -> subprocess.Popen:
        return subprocess.Popen(self.command(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=self.env(), preexec_fn=_as_at_a_terminal)


def _text(data: bytes | str | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def _without_root_access() -> None:
    """Drop root's power to read and write any file (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH), as for
    an ordinary user: a file's permissions then apply to the command (the test needs root)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):
        if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP, before exec
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def _as_at_a_terminal() -> None:
    """Ctrl-C reaches the command as at a terminal: a test run started in the background (``&``,
    nohup) ignores SIGINT, and a child inherits that, so Python would never raise KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextlib.contextmanager
def _environment(extra: dict[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class TrainedRuns:
    """One finished run per (task, runtime), trained once per session and copied into each case that
    needs one (a case may damage its copy)."""

    def __init__(self, root: Path, runner: Runner):
        self.root, self.runner = root, runner
        self.done: dict[tuple[str, str], tuple[Path, list[str]]] = {}

    def get(self, task: str, runtime: str = "sync") -> tuple[Path, list[str]]:
        """(run directory, the data arguments it was trained with)."""
        key = (task, runtime)
        if key not in self.done:
            home = self.root / f"{task}-{runtime}"
            data = write_data(home / "data", task)
            result = self.runner(["-q", "train", *train_args(task, data, runtime), "--set", "checkpoint.keep=3",
                                  "--epochs", "3", "--out", str(home / "run")])
            assert result.code == 0, f"training the {task} run for the corpus failed:\n{result}"
            self.done[key] = (home / "run", data)
        return self.done[key]


def train_args(task: str, data: list[str], runtime: str = "sync") -> list[str]:
    return [*BASE, *TASK_ARGS[task], *data, *RUNTIMES[runtime]]


def compare_args(task: str, data: list[str], strategies: str) -> list[str]:
    """``compare`` of ``strategies`` on ``data`` (the training options without a strategy)."""
    return ["-q", "compare", "--strategies", strategies, *BASE, *TASK_ARGS[task], *data]


def write_data(directory: Path, task: str) -> list[str]:
    """Tiny data of ``task`` in ``directory``; the ``--dataset`` arguments that read it."""
    directory.mkdir(parents=True, exist_ok=True)
    if task == "kge":
        triples = random_triples(30, 4, 260, seed=1)
        train = triples[:220]
        names = {h for h, _, _ in train} | {t for _, _, t in train}
        held = [t for t in triples[220:] if t[0] in names and t[2] in names]
        return ["--dataset", str(write_graph(directory / "graph", train, held[: len(held) // 2],
                                             held[len(held) // 2:]))]
    if task == "ctr":
        return ["--dataset", str(write_criteo(directory / "clicks.tsv", 400, 3))]
    if task == "mf":
        return ["--dataset", str(write_ratings(directory / "ratings.tsv", 25, 20, 300, 4))]
    if task == "image":
        return ["--dataset", str(write_images(directory / "images", 240, 60, 5))]
    return ["--dataset", str(write_corpus(directory / "corpus.txt", 60, 5))]


def data_file(data: list[str], task: str) -> Path:
    """The file of ``data`` a reader of ``task`` reads first (a graph's train.txt)."""
    path = Path(data[data.index("--dataset") + 1])
    return path / "train.txt" if task == "kge" else path


@dataclass
class Workspace:
    root: Path
    runner: Runner
    runs: TrainedRuns
    notes: list[str] = field(default_factory=list)

    def cadence(self, *argv: str, env: dict[str, str] | None = None, plain_user: bool = False,
                timeout: float | None = None) -> Result:
        """``plain_user``: without root's power over file permissions (a real process). ``timeout``:
        seconds, in a real process of its own (a hang is then a result: killed, exit -9)."""
        if timeout is not None:
            return self.runner.process(list(argv), env=env, plain_user=plain_user, timeout=timeout)
        return self.runner(list(argv), env=env, plain_user=plain_user)

    def data(self, task: str, name: str = "data") -> list[str]:
        return write_data(self.root / name, task)

    def train(self, task: str, *extra: str, runtime: str = "sync", data: list[str] | None = None,
              out: Path | None = None, **kwargs) -> Result:
        data = self.data(task) if data is None else data
        out = self.root / "run" if out is None else out
        return self.cadence("-q", "train", *train_args(task, data, runtime), "--out", str(out), *extra, **kwargs)

    def trained(self, task: str, runtime: str = "sync") -> tuple[Path, list[str]]:
        """A copy of a finished run of ``task`` in this workspace, and a copy of its data (same paths
        relative to the workspace, so the run's config points at the copy)."""
        source, data = self.runs.get(task, runtime)
        run = self.root / "trained"
        shutil.copytree(source, run, symlinks=True)
        own = self.root / "trained-data"
        shutil.copytree(source.parent / "data", own)
        mapped = [arg.replace(str(source.parent / "data"), str(own)) for arg in data]
        config = run / "config.yaml"
        config.write_text(config.read_text().replace(str(source.parent / "data"), str(own)))
        return run, mapped

    # ---- what a user should see ------------------------------------------------------------------
    def fails(self, result: Result, *mentions: str, code: int | None = 2) -> str:
        """The error rules: exit ``code`` (any non-zero one when None), no traceback, exactly one
        ``cadence: error:`` line, the last one printed, containing every one of ``mentions``."""
        assert "Traceback" not in result.err, f"a traceback:\n{result}"
        if code is None:
            assert result.code not in (0, None), f"exit 0 on a mistake:\n{result}"
        else:
            assert result.code == code, f"exit {result.code}, expected {code}:\n{result}"
        lines = [line for line in result.err.splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("cadence: error:")]
        assert len(errors) == 1, f"expected one 'cadence: error:' line:\n{result}"
        assert lines[-1] == errors[0], f"the error line is not the last thing printed:\n{result}"
        # words are looked for outside the paths (a test's directory is named after the test)
        masked = mask_paths(errors[0])
        for mention in mentions:
            where = errors[0] if "/" in mention else masked
            assert mention.lower() in where.lower(), f"the error does not mention {mention!r}:\n{result}"
        return masked

    def succeeds(self, result: Result) -> None:
        assert result.code == 0, f"expected success:\n{result}"
        assert "Traceback" not in result.err, f"a traceback:\n{result}"

    def absent(self, path: Path) -> None:
        assert not path.exists(), f"{path} was created (a mistake must leave nothing behind)"

    def unchanged(self, before: dict[str, str], root: Path) -> None:
        after = tree_digest(root)
        changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        assert not changed, f"{root} changed: {changed[:8]}"


def mask_paths(text: str) -> str:
    """``text`` with every absolute path as PATH (what is left is the message's own words)."""
    return re.sub(r"/[^\s:'\",()]+", "PATH", text)


def tree_digest(root: Path) -> dict[str, str]:
    """{relative path: sha256} of the files under ``root`` (the lock file aside: it is the lock)."""
    digests = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.name != ".lock":
            digests[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digests


def interrupt_when(process: subprocess.Popen, ready: Callable[[], bool], sign: int = signal.SIGINT,
                   timeout: float = 240) -> Result:
    """Send ``sign`` to ``process`` once ``ready()`` holds; its result."""
    deadline = time.monotonic() + timeout
    while not ready():
        if process.poll() is not None:
            out, err = process.communicate()
            raise AssertionError(f"the run ended (exit {process.returncode}) before it could be interrupted:\n{err}")
        assert time.monotonic() < deadline, "the run never got to the moment of the interrupt"
        time.sleep(0.01)
    process.send_signal(sign)
    try:
        out, err = process.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        return Result(-9, out, err + "\n(still running 90 s after the signal: killed)")
    return Result(process.returncode, out, err)
