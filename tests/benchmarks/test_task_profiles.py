"""benchmarks/task_profiles.py: each py-spy sample lands in the stage of the step it was taken in
(hand-written stacks as the reference), and docs/benchmarks.md's table is the committed result's."""

from __future__ import annotations

import copy
import json

import pytest

from tests.benchmarks import REPO, benchmark_script

profiles = benchmark_script("task_profiles")
ROOT = ["<module> (cadence:6)", "main (cadence/cli.py:141)", "Trainer.fit (cadence/training/trainer.py:91)"]
EPOCH = [*ROOT, "Trainer._run_epoch (cadence/training/trainer.py:134)", "SyncStrategy.run_epoch (x.py:1)",
         "Stages.run (cadence/pipeline/stages.py:111)"]
COMPUTE = [*EPOCH, "ComputeStage.__call__ (s.py:66)", "ComputeStage._compute (s.py:77)"]


@pytest.mark.parametrize("stack, expected", [
    ([*EPOCH, "LoadStage.__call__ (s.py:50)", "LoadStage.prepare (s.py:40)", "Word2VecTask.prepare (w.py:1)",
      "AliasTable.sample (w.py:2)"], "prepare"),
    ([*EPOCH, "LoadStage.__call__ (s.py:50)", "LoadStage.read (s.py:47)", "EmbeddingStore.pull (e.py:1)",
      "_gather (e.py:2)"], "gather"),
    ([*COMPUTE, "KgeTask.loss (k.py:1)", "DistMult.score (m.py:1)"], "forward"),
    ([*COMPUTE, "backward (torch/_tensor.py:623)", "_engine_run_backward (torch/autograd/graph.py:979)"], "backward"),
    ([*COMPUTE, "RowwiseAdagrad.step (cadence/optim.py:51)"], "optimizer"),
    ([*COMPUTE, "Optimizer.profile_hook_step.<locals>.wrapper (torch/optim/optimizer.py:1)", "Adam.step (a.py:1)"],
     "optimizer"),
    ([*COMPUTE, "Optimizer.zero_grad (torch/optim/optimizer.py:2)"], "optimizer"),
    ([*COMPUTE, "row_gradient (cadence/optim.py:9)"], "epoch other"),
    ([*EPOCH, "WriteStage.__call__ (s.py:98)", "EmbeddingStore.set (e.py:3)"], "write"),
    ([*EPOCH, "DeviceLink.upload (t.py:1)"], "transfer"),
    ([*ROOT, "Trainer.evaluate (t.py:169)", "KgeTask.evaluate (k.py:2)"], "evaluation"),
    ([*ROOT, "Task.final_metrics (b.py:140)", "Trainer.evaluate (t.py:169)"], "evaluation"),
    ([*ROOT[:2], "load_corpus (c.py:1)"], "setup"),
    (["Thread._bootstrap (threading.py:1002)", "Thread.run (threading.py:982)", "_worker (concurrent/futures/thread.py:93)",
      "skipgram_loss_and_gradient.<locals>.part (cadence/compiled.py:170)"], "helper threads"),
    ([""], "intra-op threads"),
    (["numbered_lines (x.py:1)"], "unattributed"),
])
def test_each_sample_lands_in_the_stage_it_was_taken_in(stack: list[str], expected: str) -> None:
    assert profiles.stage(stack) == expected


def test_shares_count_the_samples_of_each_stage() -> None:
    raw = "\n".join([";".join([*COMPUTE, "KgeTask.loss (k.py:1)"]) + " 30",
                     ";".join([*EPOCH, "LoadStage.prepare (s.py:40)", "KgeTask.prepare (k.py:3)"]) + " 10",
                     ";".join([*ROOT[:2], "build (b.py:1)"]) + " 60"])
    summary = profiles.summarize(raw)
    assert summary["samples"] == 100 and summary["epoch_samples"] == 40
    assert summary["share_of_epoch"]["forward"] == pytest.approx(0.75)
    assert summary["share_of_epoch"]["prepare"] == pytest.approx(0.25)
    assert summary["share_of_run"]["setup"] == pytest.approx(0.6)
    assert summary["top_self_in_epoch"][0] == ["KgeTask.loss", pytest.approx(0.75)]


def test_a_frame_name_with_a_line_break_does_not_break_the_count() -> None:
    """py-spy writes a frame's name as it is: one that holds a newline (a generated function's)
    splits its sample's line in two; the entry goes on in the next line."""
    raw = "\n".join([";".join([*COMPUTE, "KgeTask.loss (k.py:1)"]) + " 30",
                     ";".join([*COMPUTE, "<compiled (\n", "generated.py:3)"]) + " 10"])
    summary = profiles.summarize(raw)
    assert summary["samples"] == 40 and summary["share_of_epoch"]["epoch other"] == pytest.approx(0.25)


def test_the_docs_table_is_the_one_the_result_file_gives() -> None:
    documented = profiles.doc_tables.block((REPO / "docs" / "benchmarks.md").read_text(), profiles.NAME,
                                           profiles.SCRIPT)
    assert documented is not None, "docs/benchmarks.md lost its task-profiles markers"
    report = json.loads(profiles.RESULT.read_text())
    assert documented == profiles.render(report), "run: python3 benchmarks/task_profiles.py --render --write"
    changed = copy.deepcopy(report)
    task = next(iter(changed["tasks"]))
    changed["tasks"][task]["share_of_epoch"]["forward"] = 0.987
    assert "99%" in profiles.render(changed).splitlines()[2] and profiles.render(changed) != documented
