"""``strategy: auto``: the rule, with injected speeds, and a real run that chooses and trains."""

from __future__ import annotations

import functools
import json
import pickle
from pathlib import Path

import pytest
import torch
import yaml

from cadence import api
from cadence.strategies.catalog import STRATEGIES
from cadence.errors import ConfigError
from cadence import auto
from tests.conftest import make_config


def trials(**speeds: float | None) -> list[auto.Trial]:
    return [auto.Trial(name, speed, batches=100, seconds=1.0) for name, speed in speeds.items()]


@pytest.mark.parametrize("speeds, chosen", [
    ({"sync": 1000.0, "oac": 1030.0}, "sync"),    # in memory: the pipeline has nothing to hide (UMLS)
    ({"sync": 1000.0, "oac": 960.0}, "sync"),
    ({"sync": 1000.0, "oac": 1600.0}, "oac"),     # out of core: OAC hides the reads
    ({"sync": 1000.0, "gba": 2100.0}, "gba"),     # 4 workers and a straggler: GBA does not wait for it
    ({"sync": 1000.0, "gba": 1040.0}, "sync"),
    ({"sync": None, "oac": 500.0}, "oac"),        # sync could not run here
])
def test_the_rule_keeps_sync_unless_another_is_margin_times_faster(speeds, chosen) -> None:
    name, reason = auto.pick(trials(**speeds), margin=1.05)
    assert name == chosen and reason.startswith(f"{chosen}:")
    assert "\n" not in reason and all(f"{speed:,.0f}" in reason for speed in speeds.values() if speed)


def test_the_margin_is_a_setting() -> None:
    assert auto.pick(trials(sync=1000.0, oac=1300.0), margin=1.5)[0] == "sync"
    assert auto.pick(trials(sync=1000.0, oac=1300.0), margin=1.2)[0] == "oac"


def test_no_candidate_that_ran_is_an_error_naming_each() -> None:
    with pytest.raises(ConfigError, match="no candidate could train here .*sync: broken; oac: also"):
        auto.pick([auto.Trial("sync", None, note="broken"), auto.Trial("oac", None, note="also")], margin=1.05)


def test_the_candidates_are_the_strategies_that_keep_syncs_model(tiny_graph: Path) -> None:
    assert api.candidates(make_config(None, f"data.dataset={tiny_graph}")) == ["sync", "oac"]
    assert api.candidates(make_config(None, f"data.dataset={tiny_graph}", "ps.workers=4")) == ["sync", "gba"]
    # on Ray one worker is the parameter server's too: gba, not oac (which runs in one process only)
    assert api.candidates(make_config(None, f"data.dataset={tiny_graph}", "ps.engine=ray")) == ["sync", "gba"]


def test_the_candidates_follow_what_each_strategy_declares(tiny_graph: Path, monkeypatch) -> None:
    monkeypatch.setattr(STRATEGIES.get("async"), "keeps_sync_model", True)
    monkeypatch.setattr(STRATEGIES.get("gba"), "keeps_sync_model", False)
    assert api.candidates(make_config(None, f"data.dataset={tiny_graph}")) == ["sync", "async", "oac"]
    assert api.candidates(make_config(None, f"data.dataset={tiny_graph}", "ps.workers=4")) == ["sync", "async"]


def test_choose_runs_every_candidate_with_the_runs_config_and_records_why(tiny_graph: Path) -> None:
    config = make_config(None, f"data.dataset={tiny_graph}", "strategy=auto", "ps.workers=4",
                         "ps.stragglers=[0:4]")
    seen = []

    def trial(candidate, task, build, settings):
        seen.append((candidate.strategy, candidate.ps.workers, candidate.ps.stragglers))
        return auto.Trial(candidate.strategy, {"sync": 800.0, "gba": 2000.0}[candidate.strategy], 90, 1.0)

    probe = api.prepare_config(make_config(None, f"data.dataset={tiny_graph}"))
    chosen, record = auto.choose(config, api.candidates(config), lambda: api.TASKS.get("kge")(probe),
                                 api.prepare_config, None, api.for_contender, trial)
    assert seen == [("sync", 4, ["0:4"]), ("gba", 4, ["0:4"])]
    assert chosen.strategy == "gba" and config.strategy == "auto"  # (the caller's config untouched)
    assert record["chosen"] == "gba" and [t["strategy"] for t in record["trials"]] == ["sync", "gba"]


def test_a_run_with_strategy_auto_measures_chooses_and_trains(tiny_graph: Path, tmp_path: Path, caplog) -> None:
    caplog.set_level("INFO", logger="cadence")
    result = api.train(make_config(tmp_path / "run", f"data.dataset={tiny_graph}", "strategy=auto",
                                   "auto.trial_batches=30"))
    record = result.summary["auto"]
    assert result.summary["strategy"] == record["chosen"] in ("sync", "oac")
    assert [t["strategy"] for t in record["trials"]] == ["sync", "oac"]
    assert all(t["examples_per_second"] > 0 and t["batches"] > 0 for t in record["trials"])
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["strategy"] == record["chosen"]
    assert f"strategy auto chose {record['reason']}" in caplog.text
    assert json.loads((tmp_path / "run" / "auto.json").read_text()) == record
    resumed = api.resume(tmp_path / "run", {"train.epochs": 3})  # continues with the chosen strategy
    assert resumed.summary["strategy"] == record["chosen"] and resumed.summary["auto"] == record


def test_auto_settings_without_strategy_auto_are_refused(tiny_graph: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="auto.margin.*: read only with strategy: auto"):
        api.train(make_config(tmp_path / "run", f"data.dataset={tiny_graph}", "auto.margin=1.2"))
    with pytest.raises(ConfigError, match="auto.margin must be a finite ratio of at least 1"):
        make_config(None, "auto.margin=0.5")


def test_compare_takes_auto_as_a_contender(tiny_graph: Path, tmp_path: Path) -> None:
    comparison = api.compare(make_config(None, f"data.dataset={tiny_graph}", "auto.trial_batches=24"),
                             ["sync", "auto"], tmp_path / "cmp")
    assert comparison["strategies"]["auto"]["summary"]["auto"]["chosen"] in ("sync", "oac")


def killed_on_build(candidate, task, scratch):
    """A candidate's runtime whose process is killed as it builds (a memory cap's OOM kill)."""
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


def test_an_isolated_trial_that_dies_is_a_candidate_that_could_not_run(tiny_graph: Path) -> None:
    """Each trial runs in a process of its own (``auto.isolate``): one killed there (as a memory cap
    kills) is reported with its exit code, and this process goes on."""
    config = api.prepare_config(make_config(None, f"data.dataset={tiny_graph}"))
    trial = auto.isolated_trial(config, functools.partial(api.TASKS.get("kge"), config), killed_on_build, config.auto)
    assert trial.examples_per_second is None and "exit code -9: killed, out of memory?" in trial.note
    alive = auto.isolated_trial(config, functools.partial(api.TASKS.get("kge"), config), api.trial_runtime, config.auto)
    assert alive.examples_per_second > 0 and alive.batches > 0


def test_isolated_trials_run_before_this_process_reads_the_data(tiny_graph: Path, tmp_path: Path, monkeypatch) -> None:
    """With ``auto.isolate`` a memory cap holds this process and a trial's together: this process reads
    the data (builds the task) only once every trial is done, and each trial builds its own."""
    events = []
    kind = api.TASKS.get("kge")
    original_init = kind.__init__

    def init(self, *args, **kwargs):
        events.append("task built here")
        original_init(self, *args, **kwargs)

    def trial(candidate, make_task, build, settings):
        events.append(f"trial {candidate.strategy}")
        pickle.dumps(make_task)  # (it travels to the trial's spawned process)
        return auto.Trial(candidate.strategy, {"sync": 800.0, "oac": 2000.0}[candidate.strategy], 40, 1.0)

    monkeypatch.setattr(kind, "__init__", init)
    monkeypatch.setattr(auto, "isolated_trial", trial)
    result = api.train(make_config(tmp_path / "run", f"data.dataset={tiny_graph}", "strategy=auto"))
    assert result.summary["strategy"] == "oac"
    assert events[:3] == ["trial sync", "trial oac", "task built here"]


SPY = """
import sys
from cadence import auto, cli

measure = auto.in_own_process

def spy(*args, **kwargs):
    print(f"trial of {args[2]}: training code imported here: {'torch' in sys.modules}", file=sys.stderr)
    return measure(*args, **kwargs)

auto.in_own_process = spy
sys.exit(cli.main(sys.argv[1:]))
"""


def test_the_cli_runs_every_trial_before_it_imports_the_training_code(tiny_graph: Path, tmp_path: Path) -> None:
    """``cadence train --strategy auto``: a memory cap holds the run's process and a trial's together,
    so the run's process has imported no training code (torch: 173 MiB) and read no data while a
    trial runs; then it trains with the choice, recorded."""
    import os
    import subprocess
    import sys

    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-c", SPY, "train", "--dataset", str(tiny_graph), "--strategy", "auto",
                           "--epochs", "2", "--batch-size", "32", "--dim", "8", "--set", "train.negatives=8",
                           "--set", "auto.trial_batches=30", "--set", "threads=1", "--no-progress", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trial of sync: training code imported here: False" in done.stderr, done.stderr[-3000:]
    assert "trial of oac: training code imported here: False" in done.stderr, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["strategy"] == summary["auto"]["chosen"] in ("sync", "oac")
    assert all(t["examples_per_second"] > 0 for t in summary["auto"]["trials"])
    assert json.loads((out / "auto.json").read_text()) == summary["auto"]


def test_a_mistake_every_trial_makes_is_the_runs_error(tmp_path: Path) -> None:
    """A missing data file is no candidate's fault: the one line a run without auto gives, not a
    table of failed trials."""
    from cadence import cli

    config = make_config(tmp_path / "run", f"data.dataset={tmp_path / 'nowhere'}", "strategy=auto")
    with pytest.raises(Exception) as raised:
        auto.choose_in_processes(config, cli.candidate_trial, cli.candidate_names)
    assert "nowhere" in str(raised.value) and "no candidate could train" not in str(raised.value)


# ---- a table on disk larger than memory: the trial times it from a cold page cache, then warm ----------
class _Clock:
    """A trial's clock, advanced by the fake runtime's batches: cold batches (after ``evict``, the
    first ``cold_batches``) take ``cold`` seconds each, the rest ``warm``."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _DiskRuntime:
    strategy = ""

    def __init__(self, clock: _Clock, on_disk: int, cold: float, warm: float, cold_batches: int) -> None:
        self.clock, self.on_disk, self.cold, self.warm, self.cold_batches = clock, on_disk, cold, warm, cold_batches
        self.events: list[str] = []
        self.pending_cold = 0  # batches still cold (the page cache holds none of their rows)

    def run_epoch(self, plans, on_batch):
        for _ in plans:
            self.clock.now += self.cold if self.pending_cold > 0 else self.warm
            self.pending_cold = max(0, self.pending_cold - 1)
        examples = sum(len(plan.examples) for plan in plans)
        self.events.append(f"train {len(plans)} {examples}")
        return 0.0, examples

    def table_on_disk(self) -> int:
        return self.on_disk

    def evict(self) -> None:
        self.events.append("evict")
        self.pending_cold = self.cold_batches

    def stats(self):
        return {}

    def close(self) -> None:
        pass


def _disk_trial(tiny_graph: Path, monkeypatch, *settings: str, on_disk: int, limit: int, epochs: int,
                cold_batches: int = 20) -> tuple[auto.Trial, _DiskRuntime, object]:
    config = api.prepare_config(make_config(None, f"data.dataset={tiny_graph}", f"train.epochs={epochs}",
                                            "train.batch_size=8", "auto.trial_batches=60", *settings))
    task = api.TASKS.get("kge")(config)
    clock = _Clock()
    runtime = _DiskRuntime(clock, on_disk, cold=0.04, warm=0.01, cold_batches=cold_batches)
    monkeypatch.setattr(auto.time, "perf_counter", clock)
    monkeypatch.setattr(auto, "page_cache_room", lambda: limit)
    trial = auto.run_trial(config, lambda: task, lambda *_: runtime, config.auto)
    return trial, runtime, task


def test_an_out_of_core_table_is_timed_cold_then_warm_weighted_by_the_runs_epochs(tiny_graph: Path, monkeypatch) -> None:
    """A table on disk larger than the memory the process may use: its pages are evicted after the
    warm-up (the page cache its initialisation left holds rows nobody asked for), half the timed
    batches are timed from disk, half after them; the speed weighs the two as the run will: one
    epoch cold, the others warm (a naive sum of the run's seconds per example, computed here)."""
    trial, runtime, task = _disk_trial(tiny_graph, monkeypatch, "checkpoint.every=0", on_disk=2 << 30,
                                       limit=900 << 20, epochs=3)
    evicted = runtime.events.index("evict")  # after the warm-up (20 batches), before any timed batch
    assert sum(int(event.split()[1]) for event in runtime.events[:evicted]) == 20
    per_batch = task.examples_of(8)  # (each batch: 8 edges)
    cold, warm = per_batch / 0.04, per_batch / 0.01  # examples/s of the two regimes (20 batches each)
    expected = 3 / (1 / cold + 2 / warm)  # the run: 1 epoch cold, 2 warm, at these speeds
    assert trial.examples_per_second == pytest.approx(expected, rel=1e-6)
    assert trial.batches == 40 and "cold page cache" in trial.note and "weighted 1:2 by the run's 3 epochs" in trial.note


def test_epochs_after_a_checkpoint_are_weighted_cold(tiny_graph: Path, monkeypatch) -> None:
    """Writing a checkpoint reads every row in order: the page cache then holds the table's last rows,
    and the next epoch starts cold as the first did. 5 epochs, a checkpoint every 2: epochs 0, 2, 4 cold."""
    trial, _, task = _disk_trial(tiny_graph, monkeypatch, "checkpoint.every=2", on_disk=2 << 30, limit=900 << 20,
                                 epochs=5)
    cold, warm = task.examples_of(8) / 0.04, task.examples_of(8) / 0.01
    assert trial.examples_per_second == pytest.approx(5 / (3 / cold + 2 / warm), rel=1e-6)
    assert "weighted 3:2 by the run's 5 epochs" in trial.note
    # a checkpoint after every epoch: every epoch's piece of the timed batches starts from an evicted
    # table (here the first 5 batches after an eviction are cold)
    every_epoch, runtime, _ = _disk_trial(tiny_graph, monkeypatch, "checkpoint.every=1", on_disk=2 << 30,
                                          limit=900 << 20, epochs=3, cold_batches=5)
    timed = runtime.events[runtime.events.index("evict"):]
    assert timed[0::2] == ["evict"] * (len(timed) // 2) and len(timed) >= 4  # evict, train, evict, train, ...
    pieces = [event.split() for event in timed[1::2]]
    seconds = sum(min(5, int(p[1])) * 0.04 + max(0, int(p[1]) - 5) * 0.01 for p in pieces)
    examples = sum(int(p[2]) for p in pieces)
    assert every_epoch.examples_per_second == pytest.approx(task.examples_of(examples) / seconds, rel=1e-6)
    assert "all 3 of the run's epochs cold" in every_epoch.note


@pytest.mark.parametrize("epochs, every", [(1, 1), (3, 0), (3, 1), (5, 2), (7, 3), (4, 10)])
def test_cold_epochs_follow_the_trainers_checkpoints(epochs: int, every: int) -> None:
    """Against the trainer's rule, simulated naively: after ``finished`` epochs a checkpoint is written
    when ``finished % every == 0`` (or at the end); the epoch after one starts cold, as epoch 0 does."""
    from cadence.config import CheckpointConfig

    cold = [0] + [finished for finished in range(1, epochs) if every and finished % every == 0]
    assert auto.cold_epochs(epochs, CheckpointConfig(every=every)) == len(cold)


def test_a_one_epoch_run_out_of_core_is_timed_cold_only(tiny_graph: Path, monkeypatch) -> None:
    trial, runtime, task = _disk_trial(tiny_graph, monkeypatch, on_disk=2 << 30, limit=900 << 20, epochs=1,
                                       cold_batches=1000)
    assert "evict" in runtime.events
    assert trial.examples_per_second == pytest.approx(task.examples_of(8) / 0.04, rel=1e-6)
    assert "then warm" not in trial.note


@pytest.mark.parametrize("on_disk, limit, settings, evicted", [
    (0, 900 << 20, (), False),                          # rows in memory: nothing to evict
    (100 << 20, 900 << 20, (), False),                  # a table on disk that fits: its steady state is warm
    (100 << 20, 900 << 20, ("auto.page_cache=cold",), True),
    (2 << 30, 900 << 20, ("auto.page_cache=warm",), False),
])
def test_which_tables_a_trial_times_cold(tiny_graph: Path, monkeypatch, on_disk, limit, settings, evicted) -> None:
    trial, runtime, _ = _disk_trial(tiny_graph, monkeypatch, *settings, on_disk=on_disk, limit=limit, epochs=3)
    assert ("evict" in runtime.events) == evicted
    assert ("cold page cache" in trial.note) == evicted


def _resident_pages(path: Path) -> int:
    """Pages of ``path`` the kernel's page cache holds (mincore on a fresh mapping of the file): the
    kernel's own account, independent of the store."""
    import ctypes
    import mmap
    import os

    size = path.stat().st_size
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    with open(path, "rb") as file:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, file.fileno(), 0)
        assert address not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        vector = ctypes.create_string_buffer(pages)
        try:
            assert libc.mincore(address, size, vector) == 0, os.strerror(ctypes.get_errno())
        finally:
            libc.munmap(address, size)
    return sum(byte & 1 for byte in vector.raw)


def _filesystem(path: Path) -> str:
    """The type of the filesystem ``path`` is on (the longest mount point above it, /proc/mounts)."""
    best, kind = "", ""
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        point = fields[1].replace("\\040", " ")
        if str(path.resolve()).startswith(point.rstrip("/") + "/") and len(point) > len(best):
            best, kind = point, fields[2]
    return kind


def test_evict_drops_a_mapped_tables_pages_and_keeps_its_rows(tmp_path: Path) -> None:
    """``EmbeddingStore.evict``: every written row is on disk afterwards (read back through a fresh
    mapping), and the page cache holds (almost) none of the table (mincore), where it held all of it."""
    import numpy as np

    from cadence.store.embedding_store import create_store

    store = create_store(20_000, 64, 1, "mmap", str(tmp_path / "table"))
    store.initialize(0.1, seed=3)
    store.values[::7] += 1.0  # dirty pages that exist only in memory until flushed
    expected = store.values.clone()
    values = tmp_path / "table" / "values.npy"
    before = _resident_pages(values)
    if before == 0:
        pytest.skip("this filesystem keeps no page cache for the table's file")
    assert store.evict() == store.disk_bytes > 0
    if _filesystem(values) in ("tmpfs", "ramfs"):
        pytest.skip("the table is on a memory filesystem: the page cache is its storage")
    after = _resident_pages(values)
    assert after <= before // 20, (before, after)
    assert np.array_equal(np.load(values, mmap_mode="r"), expected.numpy())
    assert torch.equal(store.values, expected)  # the store reads them back from the file
