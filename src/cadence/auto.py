"""``strategy: auto``: measure, on the user's data and machine, a short trial of each strategy that
keeps sync's model, and train with the fastest.

Candidates: the strategies that declare sync's model their guarantee (``Strategy.keeps_sync_model``)
and run, for this config, on the runtime ``sync`` takes: one worker (``ps.workers: 1``): ``sync`` and
``oac`` (the synchronous run of its computation order, bit for bit); several workers: ``sync`` (a
barrier per global step) and ``gba`` (the synchronous global batch, stale gradients beyond
``ps.tolerance`` dropped). ``async``, ``hop_*``, ShadowSync, pdASGD and AdaPM trade the model for speed
and are never chosen.

A trial (by default in a fresh process of its own, ``auto.isolate``) builds the candidate's runtime as
the run would (same config, data, seed, stragglers),
trains ``auto.trial_batches`` batches (at most as many as the run itself trains, at least 40): a tenth
(at least 20, at most half) a warm-up, untimed, then the
rest, each part the first batches of an epoch (epoch 0's, then 1's, ... for a small data set), fewer
if the timed part would take longer than ``auto.trial_seconds``), and measures examples per second.
The rule (``pick``): ``sync`` unless another candidate is ``auto.margin`` times faster (a bit-exact
reference is worth a few percent of noise); else the fastest. The trial table and a one-line reason
are logged, recorded in summary.json (``auto``) and in ``auto.json`` beside the run; the run's
config.yaml records the chosen strategy, so ``--resume`` continues with it.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
import multiprocessing
import os
import shutil
import signal
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

from cadence.config import AutoConfig, CheckpointConfig, Config
from cadence.errors import CadenceError, ConfigError
from cadence.resources import end_process, gib, page_cache_room, processes_marked, release_memory

if TYPE_CHECKING:  # (names for annotations only: this module imports no training code, so the CLI can
    # run every trial in a process of its own before it imports torch or reads any data)
    from cadence.core.runtime import Runtime
    from cadence.tasks.base import Task

log = logging.getLogger("cadence")

AUTO = "auto"
AUTO_FILE = "auto.json"  # in a run that chose its strategy: the trials and the reason
REFERENCE = "sync"
WARM_BATCHES = 20  # at least this many warm-up batches (first calls, thread teams, caches), half at most
MIN_TRIAL_BATCHES = 40  # a trial of a run shorter than this still trains this many
# the timed batches in this many parts (each the start of an epoch), the speed their median: 1, since a
# parameter server's epoch start (its workers, a straggler's CPU quota) weighs on short parts; 5 parts
# made gba lose its lead over sync with a straggler (docs/auto.md)
TIMED_PARTS = 1
MAX_TRIAL_EPOCHS = 1000
# how a trial's process starts: forked (sharing this process's imports) where the system can, else spawned
TRIAL_START = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
ISOLATED_TIMEOUT = 600.0  # seconds a trial's process may take beyond 4 x auto.trial_seconds (imports, data, setup)
CHILD_GRACE_SECONDS = 10.0  # an interrupted trial's process: seconds to unwind before it is killed


@dataclass
class Trial:
    strategy: str
    examples_per_second: float | None  # None: the candidate could not run here (``note`` says why)
    batches: int = 0
    seconds: float = 0.0
    gradients_dropped: int | None = None
    note: str = ""


class Catalog(Protocol):
    """The strategy registry as this module reads it (``strategies.catalog.STRATEGIES``, passed in:
    this module imports no training code)."""

    def names(self) -> list[str]: ...

    def get(self, name: str) -> Any: ...


def candidates(config: Config, strategies: Catalog) -> list[str]:
    """The strategies whose guarantee is sync's model (``keeps_sync_model``) that run, for this config,
    on the runtime sync takes (one worker: the pipeline; several: the parameter server); sync first."""
    reference = strategies.get(REFERENCE).runtime(config).name
    names = [REFERENCE]
    for name in strategies.names():
        entry = strategies.get(name)
        if name == REFERENCE or not entry.keeps_sync_model:
            continue
        try:
            if entry.runtime(config).name == reference:
                names.append(name)
        except ConfigError:  # (no runtime of its fits this config)
            continue
    return names


def pick(trials: list[Trial], margin: float) -> tuple[str, str]:
    """(the chosen strategy, the reason in one line) from measured trials: sync unless another is
    ``margin`` times faster; else the fastest."""
    ran = [trial for trial in trials if trial.examples_per_second]
    if not ran:
        raise ConfigError("strategy: auto: no candidate could train here (" +
                          "; ".join(f"{t.strategy}: {t.note}" for t in trials) + ")")
    fastest = max(ran, key=lambda trial: trial.examples_per_second)
    reference = next((trial for trial in ran if trial.strategy == REFERENCE), None)
    tried = ", ".join(f"{t.strategy} {t.examples_per_second:,.0f}" for t in ran)
    if reference is None:
        return fastest.strategy, f"{fastest.strategy}: the fastest that keeps sync's model ({tried} examples/s; sync could not run)"
    ratio = fastest.examples_per_second / reference.examples_per_second
    if fastest is reference or ratio < margin:
        other = "" if fastest is reference else f"; {fastest.strategy} was {ratio:.2f}x, within auto.margin {margin:g}"
        return REFERENCE, f"sync: no candidate that keeps sync's model is {margin:g}x faster ({tried} examples/s{other})"
    return fastest.strategy, (f"{fastest.strategy}: {ratio:.2f}x sync's speed and keeps sync's model ({tried} examples/s "
                              f"over {fastest.batches} timed batches)")


Build = Callable[[Config, "Task", Path], "Runtime"]


def run_trial(config: Config, make_task: Callable[[], Task], build: Build, settings: AutoConfig) -> Trial:
    """Train the first batches of epoch 0 under ``config.strategy`` in a scratch directory; its speed.
    ``make_task``: the task (its data read), built here."""
    task = make_task()
    # no longer than the run itself (a candidate's trial costs at most one run of it), unless the run
    # is shorter than a trial can measure at all
    total = min(settings.trial_batches, max(MIN_TRIAL_BATCHES, len(task.plan(0)) * task.num_epochs()))
    warm, epoch = trial_epochs(task, 0, max(total // 10, min(WARM_BATCHES, total // 2), 1))
    with tempfile.TemporaryDirectory(prefix=scratch_prefix(os.getpid())) as scratch:
        runtime = build(config, task, Path(scratch))
        try:
            started = time.perf_counter()
            for plans in warm:
                runtime.run_epoch(plans, _nothing)
            pace = (time.perf_counter() - started) / sum(map(len, warm))  # seconds per batch
            warmed = sum(map(len, warm))
            timed = min(total - warmed, max(1, math.ceil(settings.trial_seconds / pace))) if pace > 0 else total
            on_disk, limit = runtime.table_on_disk(), page_cache_room()
            if on_disk and (settings.page_cache == "cold" or settings.page_cache == "detect" and on_disk > limit):
                trial = _out_of_core(config.strategy, runtime, task, epoch, max(1, timed), on_disk, limit,
                                     cold_epochs(task.num_epochs(), config.checkpoint))
            else:
                parts = trial_epochs(task, epoch, max(1, timed), part=max(1, math.ceil(timed / TIMED_PARTS)))[0]
                seconds, batches, examples, rates = _timed(runtime, task, parts)
                # each part's examples/s: the median of them, so one stolen slice of CPU does not decide
                trial = Trial(config.strategy, statistics.median(rates) if rates else None, batches, round(seconds, 4))
            trial.gradients_dropped = runtime.stats().get("gradients_dropped")
        finally:
            runtime.close()
            del runtime  # (its table: a memory-mapped one is unmapped now, before the next candidate maps its own)
            release_memory()
    return trial


def _timed(runtime: Runtime, task: Task, parts: list[list], cold: bool = False) -> tuple[float, int, int, list[float]]:
    """Train ``parts`` (each the start of an epoch's plan) in turn: (seconds, batches, batch examples,
    each part's examples/s); ``cold``: each part from a table whose pages were just dropped
    (``Runtime.evict``, untimed), as each epoch after a sweep of the table starts."""
    seconds, batches, examples, rates = 0.0, 0, 0, []
    for plans in parts:
        if cold:
            runtime.evict()
        started = time.perf_counter()
        _, done = runtime.run_epoch(plans, _nothing)
        took = time.perf_counter() - started
        seconds, batches, examples = seconds + took, batches + len(plans), examples + done
        if took > 0:
            rates.append(task.examples_of(done) / took)
    return seconds, batches, examples, rates


def cold_epochs(epochs: int, checkpoint: CheckpointConfig) -> int:
    """Epochs of a run that start from a cold page cache when its table on disk is larger than the
    page cache may hold: the first (after the table's initialisation, a sweep of every row) and each
    that follows a checkpoint (``checkpoint.every``: writing one reads every row in order, which
    leaves the page cache holding the table's last rows, not the hot ones)."""
    return 1 + ((max(1, epochs) - 1) // checkpoint.every if checkpoint.every > 0 else 0)


def _out_of_core(strategy: str, runtime: Runtime, task: Task, epoch: int, timed: int, on_disk: int, limit: int,
                 cold: int) -> Trial:
    """The timed part of a trial whose table is on disk and larger than the page cache may hold
    (``resources.page_cache_room``; ``auto.page_cache``): the table's pages evicted (the page cache
    its initialisation left holds rows nobody asked for yet), the first half timed from disk (as an
    epoch after a sweep of the table reads: ``cold`` of the run's epochs; its piece of each epoch
    from a table evicted again), the second half after it
    (as the other epochs read what the page cache kept); the speed: examples over the run's seconds
    per example, each regime weighted by its epochs (all of them cold: every batch timed cold)."""
    epochs = max(1, task.num_epochs())
    warm_epochs = epochs - min(cold, epochs)
    cold_batches = timed if warm_epochs == 0 or timed < 2 else math.ceil(timed / 2)
    cold_parts, after = trial_epochs(task, epoch, cold_batches)
    regimes = [_timed(runtime, task, cold_parts, cold=True)]
    if timed - cold_batches:
        regimes.append(_timed(runtime, task, trial_epochs(task, after, timed - cold_batches)[0]))
    per_example = [seconds / task.examples_of(examples) for seconds, _, examples, _ in regimes if examples]
    if not per_example or not all(per_example):
        return Trial(strategy, None, note="out of core: no examples timed")
    weights = [float(epochs - warm_epochs), float(warm_epochs)][:len(per_example)]
    speed = sum(weights) / sum(w * x for w, x in zip(weights, per_example))
    speeds = [f"{1 / x:,.0f}" for x in per_example]
    note = (f"table on disk {gib(on_disk)}, room for its pages {gib(limit)}: from a cold page cache {speeds[0]} examples/s"
            + (f", then warm {speeds[1]}, weighted {weights[0]:g}:{weights[1]:g} by the run's {epochs} epochs"
               if len(speeds) > 1 else f", all {epochs} of the run's epochs cold"))
    return Trial(strategy, speed, sum(r[1] for r in regimes), round(sum(r[0] for r in regimes), 4), note=note)


def trial_epochs(task: Task, first: int, count: int, part: int | None = None) -> tuple[list[list], int]:
    """(``count`` batches from epoch ``first`` on, as the first batches of each epoch in turn, the
    next epoch): a small data set's epoch may be shorter than a trial, and a runtime always runs the
    start of an epoch's plan (a parameter server's workers on Ray build the epoch's plan themselves
    and take batches by position); ``part``: at most this many from each epoch."""
    parts: list[list] = []
    epoch = first
    while count > 0 and epoch < first + MAX_TRIAL_EPOCHS:
        piece = task.plan(epoch)[:min(count, part or count)]
        parts.append(piece)
        count -= len(piece)
        epoch += 1
    return parts, epoch


def _nothing(batch: Any) -> None:
    return None


def isolated_trial(config: Config, make_task: Callable[[], Task], build: Build, settings: AutoConfig) -> Trial:
    """``run_trial`` in a fresh process that calls ``make_task`` (a picklable recipe: it reads the data
    itself): no candidate inherits another's memory, allocator arenas or warm page cache, and a trial
    that dies (a memory cap's kill) is a candidate that could not run."""
    return in_own_process(run_trial, (config, make_task, build, settings), config.strategy, settings)[0]


def in_own_process(target: Callable[..., Trial], args: tuple, strategy: str,
                   settings: AutoConfig) -> tuple[Trial, CadenceError | None]:
    """``target(*args)``, a trial, in a process of its own; (its trial, the ``CadenceError`` it raised,
    if any: what it says of the config or the data may be no candidate's fault)."""
    kind, value = _in_child(target, args, ISOLATED_TIMEOUT + settings.trial_seconds * 4)
    if kind == "ok":
        return value, None
    if kind == "died":
        return Trial(strategy, None, note=f"its trial process ended without a result ({value})"), None
    note, error = value
    return Trial(strategy, None, note=note), error


def _in_child(target: Callable[..., Any], args: tuple, timeout: float) -> tuple[str, Any]:
    """``target(*args)`` in a process of its own: ("ok", its value), ("error", (a one-line note, the
    ``CadenceError`` or None)) or ("died", how it ended). Forked where the system can
    (``TRIAL_START``), as a DataLoader's workers are: the child shares what this process imported,
    copy on write (spawned, it loads its own: 173 MiB of torch and cadence)."""
    context = multiprocessing.get_context(TRIAL_START)
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(target, args, send), daemon=True)
    child.start()
    send.close()
    try:
        outcome = receive.recv() if receive.poll(timeout) else None
    except EOFError:  # (it died before it could answer)
        outcome = None
    except BaseException:  # Ctrl-C or SIGTERM here: the trial ends before this process does
        stop_child(child)
        raise
    child.join(10)
    if child.is_alive():
        child.kill()
        child.join()
    sweep_child(child.pid)
    if outcome is None:
        return "died", f"exit code {child.exitcode}{': killed, out of memory?' if child.exitcode == -9 else ''}"
    return outcome


def scratch_prefix(pid: int) -> str:
    """The prefix of a trial's scratch directory: its process's id in it, so the process that
    started the trial finds what is left of it (``stop_child``)."""
    return f"cadence-auto-{pid}-"


def stop_child(child: Any, grace: float = CHILD_GRACE_SECONDS) -> None:
    """End a trial's process: SIGINT (it unwinds: its runtime closes, its scratch directory goes),
    then SIGKILL after ``grace`` seconds; whatever scratch directory it left is removed, and every
    process it started that is still there (``sweep_child``)."""
    if child.is_alive():
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGINT)
        child.join(grace)
    if child.is_alive():
        child.kill()
        child.join()
    for left in Path(tempfile.gettempdir()).glob(f"{scratch_prefix(child.pid)}*"):
        shutil.rmtree(left, ignore_errors=True)
    sweep_child(child.pid)


TRIAL_MARK = "CADENCE_TRIAL_PROCESS"  # set in a trial's environment: every process it starts inherits it


def sweep_child(pid: int) -> None:
    """SIGKILL what trial ``pid`` started and left running (its environment's ``TRIAL_MARK``): a Ray
    instance it was still starting, or one whose shutdown it did not live to finish."""
    for leftover in processes_marked(TRIAL_MARK, str(pid)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(leftover, signal.SIGKILL)


def _child(target: Callable[..., Any], args: tuple, send) -> None:
    # (forked: the parent's handlers came along.) SIGINT and SIGTERM unwind the trial, which removes
    # its scratch directory; it ends quietly, its parent is already on its way out
    # It leaves by ``os._exit`` (no atexit): what its trial started outside it (a Ray instance) is
    # stopped here, however the trial ended, and what that left (Ray's session directory) removed
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupted)
    os.environ[TRIAL_MARK] = str(os.getpid())
    try:
        send.send(("ok", target(*args)))
    except KeyboardInterrupt:
        return
    except Exception as err:  # (a candidate that cannot run here: its reason, in one line)
        note = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        send.send(("error", (note, err if isinstance(err, CadenceError) else None)))
    finally:
        with contextlib.suppress(KeyboardInterrupt):
            end_process(scratch=True)


def _interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def choose_in_processes(config: Config, candidate_trial: Callable[[Config, str], Trial],
                        candidate_names: Callable[[Config], list[str]]) -> tuple[Config, dict[str, Any]]:
    """``choose``, each candidate's whole trial in a process of its own: ``candidate_trial(config,
    name)`` (picklable) checks the candidate's config, reads the data and trains there, so this process
    needs neither the training code nor the data while trials run (the CLI: under a memory cap, the
    run's own process holds 20 MiB then, not torch's 173 MiB and the task); ``candidate_names(config)``
    (``candidates`` over the registry) runs in a process of its own first, for the same reason. A
    ``CadenceError`` every candidate raised alike (a missing file, a bad setting) is raised here, as a
    run would."""
    names = names_in_own_process(candidate_names, config)
    outcomes = [in_own_process(candidate_trial, (config, name), name, config.auto) for name in names]
    trials = [trial for trial, _ in outcomes]
    errors = [error for _, error in outcomes]
    if not any(trial.examples_per_second for trial in trials) and errors[0] is not None \
            and all(error is not None and str(error) == str(errors[0]) for error in errors):
        raise errors[0]
    return decide(config, names, trials)


def names_in_own_process(candidate_names: Callable[[Config], list[str]], config: Config) -> list[str]:
    """``candidate_names(config)`` in a process of its own (it imports the strategies' code); its
    error (a bad ``ps.engine``, say) raised here."""
    kind, value = _in_child(candidate_names, (config,), ISOLATED_TIMEOUT)
    if kind == "ok":
        return value
    note, error = value if kind == "error" else (f"its process ended without a result: {value}", None)
    raise error if error is not None else CadenceError(f"strategy: auto: the candidates could not be listed: {note}")


def choose(config: Config, names: list[str], make_task: Callable[[], Task], prepare: Callable[[Config], Config],
           build: Build, view: Callable[[Config, str, list[str]], Config] | None = None,
           trial: Callable[[Config, Callable[[], Task], Build, AutoConfig], Trial] | None = None
           ) -> tuple[Config, dict[str, Any]]:
    """This run's config with the chosen strategy, and the record of the choice (summary.json's
    ``auto``). ``make_task`` builds the task where a trial runs (isolated: a picklable recipe, called
    in the trial's process, so the caller need not hold the data while trials run); ``prepare``
    validates a candidate's config (a candidate that cannot run here is skipped, its reason noted);
    ``view``: a candidate's config (another candidate's strategy keys back to their defaults:
    ``api.for_contender``); ``trial`` measures one (tests inject speeds). ``names``: the candidates
    (``candidates``)."""
    trials = []
    for name in names:
        candidate = view(config, name, names) if view is not None else copy.deepcopy(config)
        candidate.strategy = name
        try:
            candidate = prepare(candidate)
        except ConfigError as err:
            trials.append(Trial(name, None, note=str(err)))
            continue
        measure = trial or (isolated_trial if config.auto.isolate else run_trial)
        trials.append(measure(candidate, make_task, build, config.auto))
    return decide(config, names, trials, view)


def decide(config: Config, names: list[str], trials: list[Trial],
           view: Callable[[Config, str, list[str]], Config] | None = None) -> tuple[Config, dict[str, Any]]:
    """The rule applied to measured trials, logged: this run's config with the chosen strategy (seen
    through ``view``, as ``choose``; ``names``: the candidates), and the record (summary.json's ``auto``)."""
    chosen, reason = pick(trials, config.auto.margin)
    for line in table(trials):
        log.info("%s", line)
    log.info("strategy auto chose %s", reason)
    config = view(config, chosen, names) if view is not None else copy.deepcopy(config)
    config.strategy = chosen
    return config, {"chosen": chosen, "reason": reason, "trials": [asdict(t) for t in trials]}


def table(trials: list[Trial]) -> list[str]:
    rows = [("strategy", "examples/s", "batches", "seconds", "dropped", "note")]
    for t in trials:
        rows.append((t.strategy, f"{t.examples_per_second:,.0f}" if t.examples_per_second else "-", str(t.batches),
                     f"{t.seconds:.2f}", "-" if t.gradients_dropped is None else str(t.gradients_dropped), t.note))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def save(run_dir: Path, record: dict[str, Any]) -> None:
    (Path(run_dir) / AUTO_FILE).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


def load(run_dir: Path) -> dict[str, Any] | None:
    path = Path(run_dir) / AUTO_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def check_unread(config: Config) -> None:
    """``auto.*`` set with another strategy: nothing would read it."""
    changed = [key for key, value in asdict(config.auto).items() if getattr(AutoConfig(), key) != value]
    if config.strategy != AUTO and changed:
        raise ConfigError(f"auto.{changed[0]}: read only with strategy: auto (this run's strategy is {config.strategy})")
