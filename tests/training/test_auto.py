"""``strategy: auto``: the rule, with injected speeds, and a real run that chooses and trains."""

from __future__ import annotations

import functools
import json
import pickle
from pathlib import Path

import pytest
import yaml

from cadence import api
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
    assert auto.candidates(make_config(None, f"data.dataset={tiny_graph}")) == ["sync", "oac"]
    assert auto.candidates(make_config(None, f"data.dataset={tiny_graph}", "ps.workers=4")) == ["sync", "gba"]


def test_choose_runs_every_candidate_with_the_runs_config_and_records_why(tiny_graph: Path) -> None:
    config = make_config(None, f"data.dataset={tiny_graph}", "strategy=auto", "ps.workers=4",
                         "ps.stragglers=[0:4]")
    seen = []

    def trial(candidate, task, build, settings):
        seen.append((candidate.strategy, candidate.ps.workers, candidate.ps.stragglers))
        return auto.Trial(candidate.strategy, {"sync": 800.0, "gba": 2000.0}[candidate.strategy], 90, 1.0)

    probe = api.prepare_config(make_config(None, f"data.dataset={tiny_graph}"))
    chosen, record = auto.choose(config, lambda: api.TASKS.get("kge")(probe), api.prepare_config, None,
                                 api.for_contender, trial)
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
        auto.choose_in_processes(config, cli.candidate_trial)
    assert "nowhere" in str(raised.value) and "no candidate could train" not in str(raised.value)
