"""``w2v.update`` / ``mf.update`` default to ``auto``: the task's own in-place loop (word2vec's,
Surprise's) where it applies, else batch updates, said in one line; config.yaml records the choice."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from cadence import api
from tests.conftest import make_config


def data(task_data, task: str) -> list[str]:
    return [item for item in task_data[task] if not item.startswith(f"{task}.update=")]


def trained(tmp_path: Path, name: str, *overrides: str) -> tuple[dict, dict]:
    result = api.train(make_config(tmp_path / name, "eval.every=0", "eval.test=false", *overrides))
    config = yaml.safe_load((result.run_dir / "config.yaml").read_text())
    return config, load_file(result.run_dir / "checkpoints" / "final" / "tensors.safetensors")


def same(left: dict, right: dict) -> bool:
    return left.keys() == right.keys() and all(left[key].equal(right[key]) for key in left)


def test_word2vec_trains_its_own_loop_by_default_where_it_applies(task_data, tmp_path: Path, caplog) -> None:
    """The default under sync is word2vec's own loop: the same model as asking for it, and config.yaml says pair."""
    common = data(task_data, "w2v")
    with caplog.at_level(logging.INFO, logger="cadence"):
        config, default = trained(tmp_path, "default", *common)
    assert config["w2v"]["update"] == "pair"
    assert not [r for r in caplog.records if "auto -> batch" in r.getMessage()]
    _, pair = trained(tmp_path, "pair", *common, "w2v.update=pair")
    _, batch = trained(tmp_path, "batch", *common, "w2v.update=batch")
    assert same(default, pair) and not same(default, batch)


@pytest.mark.parametrize("setting, reason", [
    ("strategy=oac", "strategy oac does not run the task's in-place loop"),
    ("optimizer.entity=adagrad", "optimizer.entity must be sgd"),
    ("train.compiled=false", "it needs train.compiled on"),
])
def test_where_it_does_not_apply_batch_updates_and_one_line_says_why(task_data, tmp_path: Path, caplog, setting,
                                                                      reason) -> None:
    common = [item for item in data(task_data, "w2v") if not item.startswith(setting.split("=")[0] + "=")]
    with caplog.at_level(logging.INFO, logger="cadence"):
        config, model = trained(tmp_path, "auto", *common, setting)
    lines = [r.getMessage() for r in caplog.records if "auto -> batch" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("w2v.update: auto -> batch updates: ") and reason in lines[0]
    assert "\n" not in lines[0]
    assert config["w2v"]["update"] == "batch"
    if setting != "strategy=oac":  # (two OAC runs may compute in different orders: each equals its own replay)
        _, batch = trained(tmp_path, "batch", *common, setting, "w2v.update=batch")
        assert same(model, batch)


def test_a_recorded_or_replayed_order_trains_batch_updates(task_data, tmp_path: Path) -> None:
    config, _ = trained(tmp_path, "rec", *data(task_data, "w2v"), f"record_order={tmp_path / 'order.jsonl'}")
    assert config["w2v"]["update"] == "batch"


def test_matrix_factorisation_runs_surprises_loop_with_sgd_and_batch_updates_with_adagrad(task_data, tmp_path: Path,
                                                                                         caplog) -> None:
    common = data(task_data, "mf")
    config, _ = trained(tmp_path, "sgd", *common, "optimizer.entity=sgd", "optimizer.lr=0.01")
    assert config["mf"]["update"] == "rating"
    with caplog.at_level(logging.INFO, logger="cadence"):
        config, _ = trained(tmp_path, "adagrad", *common)  # (the task's default optimizer)
    assert config["mf"]["update"] == "batch"
    assert any("mf.update: auto -> batch updates: " in r.getMessage() and "adagrad" in r.getMessage()
               for r in caplog.records)


def test_a_comparison_trains_one_algorithm_for_every_contender(task_data, tmp_path: Path, caplog) -> None:
    """sync alone would take the in-place loop; beside oac, which cannot, both train batch updates."""
    config = make_config(None, *data(task_data, "w2v"), "train.epochs=1", "eval.every=0", "eval.test=false")
    with caplog.at_level(logging.INFO, logger="cadence"):
        api.compare(config, ["sync", "oac"], tmp_path / "cmp", warm=False)
    for name in ("sync", "oac"):
        written = yaml.safe_load((tmp_path / "cmp" / name / "config.yaml").read_text())
        assert written["w2v"]["update"] == "batch", name
    assert len([r for r in caplog.records if "auto -> batch" in r.getMessage()]) == 1
