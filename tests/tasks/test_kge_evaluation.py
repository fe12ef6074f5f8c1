"""KGE evaluation of a table too large to hold whole: the entity rows are read a block at a time
from wherever they live (here an AdaPM run's nodes), with the whole table's metrics."""

from __future__ import annotations

import pytest
import torch

from cadence import api
from tests.conftest import make_config


def test_a_large_entity_table_is_ranked_a_block_at_a_time_with_the_whole_tables_metrics(task_data, tmp_path,
                                                                                        monkeypatch) -> None:
    from cadence.strategies.adapm.runtime import AdaPMRuntime
    from cadence.tasks import TASKS
    from cadence.tasks import kge as kge_task

    config = api.prepare_config(make_config(tmp_path / "kge", *task_data["kge"], "strategy=adapm", "ps.workers=2"))
    task = TASKS.get("kge")(config)
    runtime = AdaPMRuntime(config, task)
    runtime.run_epoch(task.plan(0), lambda batch: None)
    cluster, reads = runtime.parameters(), []

    class Recording:  # the nodes' rows, every read's size recorded
        def values(self, keys: torch.Tensor) -> torch.Tensor:
            reads.append(keys.shape[0])
            return cluster.values(keys)

    whole = task.evaluate(Recording(), runtime.dense(), "test", torch.device("cpu"), lambda steps: steps)
    entities = task.graph.num_entities
    assert reads == [entities]  # a small table: read whole, once
    reads.clear()
    width = task.table().width
    monkeypatch.setattr(kge_task, "WHOLE_TABLE_FLOATS", 0)  # as if the table were too large to hold
    monkeypatch.setattr(kge_task, "ENTITY_BLOCK_FLOATS", 7 * width)  # 7 entities a block
    blocked = task.evaluate(Recording(), runtime.dense(), "test", torch.device("cpu"), lambda steps: steps)
    queries = min(task.graph.test.shape[0], 1024)
    assert max(reads) <= max(7, queries) and sum(reads) >= entities  # never the table at once
    assert set(blocked) == set(whole)
    for name, value in whole.items():
        assert blocked[name] == pytest.approx(value, rel=1e-12), name
    runtime.close()


def test_sampled_ranking_is_labelled_fixed_per_split_and_exact_with_every_entity(task_data, tmp_path) -> None:
    """``eval.negatives``: each query ranked against that many entities drawn once per split from the
    run's seed (the same at every evaluation: valid's metric can drive early stopping), labelled with
    ``eval_candidates`` in summary.json and metrics.jsonl; with as many as there are entities it is the
    exact ranking, number for number; with fewer, ranks can only improve (fewer candidates to beat)."""
    from cadence.tasks import TASKS

    exact = api.train(make_config(tmp_path / "exact", *task_data["kge"], "train.epochs=2"))
    entities = TASKS.get("kge")(api.prepare_config(make_config(tmp_path / "x", *task_data["kge"]))).graph.num_entities
    every = api.train(make_config(tmp_path / "every", *task_data["kge"], "train.epochs=2",
                                  f"eval.negatives={entities}"))
    assert every.summary["eval_candidates"] == entities and "eval_candidates" not in exact.summary
    for name in ("mrr", "hits@1", "hits@10"):
        assert every.summary[name] == exact.summary[name], name
    sampled = api.train(make_config(tmp_path / "sampled", *task_data["kge"], "train.epochs=2",
                                    f"eval.negatives={entities // 3}"))
    assert sampled.summary["eval_candidates"] == entities // 3
    assert all(row["eval_candidates"] == entities // 3 for row in sampled.metrics)
    assert sampled.summary["mrr"] >= exact.summary["mrr"]  # the same model (the seed), fewer to beat
    again = api.evaluate(sampled.run_dir, "test")  # the same candidates as at the run's end
    assert again["mrr"] == sampled.summary["mrr"]
    task = TASKS.get("kge")(api.prepare_config(make_config(tmp_path / "y", *task_data["kge"],
                                                           f"eval.negatives={entities // 3}")))
    assert torch.equal(task.eval_candidates("valid"), task.eval_candidates("valid"))
    assert not torch.equal(task.eval_candidates("valid"), task.eval_candidates("test"))
