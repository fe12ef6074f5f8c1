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
