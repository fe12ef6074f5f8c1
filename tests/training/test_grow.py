"""Growing a trained model onto data whose vocabulary changed (``train.init_from``, every task).

The reference is independent of the code under test: what each run exports (``cadence export
--format tsv``: a name, then the row) and set arithmetic on those names. A run with a learning rate
of 1e-30 changes no float32 row, so its export is the model it started from: the grown run's must hold
the old run's row for every name both know, a scratch run's initial row for every new name, and no
dropped name. ``train.freeze: known`` is checked after real training: known rows unchanged bit for
bit, new ones trained, under every strategy and on Ray.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from cadence import api
from cadence.errors import CadenceError, CheckpointError, ConfigError
from cadence.training import grow
from cadence.training.run_directory import RunDirectory
from tests.conftest import TINY_WORDS, make_config, random_triples, write_criteo, write_graph, write_images, write_ratings
from cadence.strategies.catalog import STRATEGIES
from tests.test_task_matrix import STRATEGY_NAMES
from tests.training.test_every_task_resumes import read_tsv

TASKS = ("kge", "ctr", "mf", "w2v", "image")
STILL = ["optimizer.lr=1e-30"]  # no float32 row moves at this rate


def _graph(directory: Path, triples: list[tuple]) -> Path:
    train = triples[: int(len(triples) * 0.85)]
    names = {h for h, _, _ in train} | {t for _, _, t in train}
    relations = {r for _, r, _ in train}
    held = [t for t in triples[len(train):] if t[0] in names and t[2] in names and t[1] in relations]
    return write_graph(directory, train, held[: len(held) // 2], held[len(held) // 2:])


def _keep_lines(source: Path, target: Path, keep) -> Path:
    target.write_text("".join(line + "\n" for line in source.read_text().splitlines() if keep(line)))
    return target


@pytest.fixture
def grow_data(tmp_path: Path) -> dict[str, tuple[list[str], list[str]]]:
    """Per task: (overrides of the old run, of the new data), the new data with ids added and dropped."""
    triples = random_triples(36, 5, 420, seed=2)
    old_graph = _graph(tmp_path / "graph-old", [t for t in triples if int(t[0][1:]) < 30 and int(t[2][1:]) < 30
                                                 and t[1] != "r4"])
    new_graph = _graph(tmp_path / "graph-new", [t for t in triples if int(t[0][1:]) >= 4 and int(t[2][1:]) >= 4
                                                 and t[1] != "r0"])
    ratings = write_ratings(tmp_path / "ratings.tsv", 30, 20, 420, 4)
    old_ratings = _keep_lines(ratings, tmp_path / "ratings-old.tsv", lambda line: int(line.split("\t")[0][1:]) < 24)
    new_ratings = _keep_lines(ratings, tmp_path / "ratings-new.tsv", lambda line: int(line.split("\t")[0][1:]) >= 4)
    rng = random.Random(5)
    sentences = [[rng.choice(TINY_WORDS[:20]) for _ in range(12)] for _ in range(60)]
    (tmp_path / "corpus-old.txt").write_text("".join(" ".join(s) + "\n" for s in sentences))
    renamed = [[{"tiger": "zebra", "cat": "lion"}.get(w, w) for w in s] for s in sentences]
    (tmp_path / "corpus-new.txt").write_text("".join(" ".join(s) + "\n" for s in renamed))
    images = write_images(tmp_path / "images", 240, 60, 5)
    w2v = ["task=w2v", "w2v.min_count=1", "w2v.sample=0.01", "optimizer.entity=sgd", "w2v.min_lr=1e-30",
           "model.init_std=0.03"]
    return {
        "kge": ([f"data.dataset={old_graph}"], [f"data.dataset={new_graph}"]),
        "ctr": (["task=ctr", "model.name=fm", "model.init_std=0.1", f"data.dataset={write_criteo(tmp_path / 'a.tsv', 300, 3)}"],
                ["task=ctr", "model.name=fm", "model.init_std=0.1", f"data.dataset={write_criteo(tmp_path / 'b.tsv', 300, 4)}"]),
        "mf": (["task=mf", "model.init_std=0.1", f"data.dataset={old_ratings}"],
               ["task=mf", "model.init_std=0.1", f"data.dataset={new_ratings}"]),
        "w2v": ([*w2v, f"data.dataset={tmp_path / 'corpus-old.txt'}"], [*w2v, f"data.dataset={tmp_path / 'corpus-new.txt'}"]),
        "image": (["task=image", f"data.dataset={images}", "image.valid_size=40", "image.hidden=[16]", "optimizer.dense=sgd"],
                  ["task=image", f"data.dataset={images}", "image.valid_size=40", "image.hidden=[16]", "optimizer.dense=sgd"]),
    }


def exported(run_dir: Path, out: Path) -> dict[str, dict[str, np.ndarray]]:
    """{file: {name: row}} of the run's ``--format tsv`` export."""
    files = api.export(run_dir, out, "tsv")
    return {path.name: dict(zip(*read_tsv(path))) for path in files}


def train(tmp_path: Path, name: str, *overrides: str):
    return api.train(make_config(tmp_path / name, *overrides))


@pytest.mark.parametrize("task", TASKS)
def test_a_grown_run_starts_from_the_old_rows_by_name_and_new_rows_from_scratch(task: str, grow_data,
                                                                               tmp_path: Path) -> None:
    old_data, new_data = grow_data[task]
    old = train(tmp_path, "old", *old_data)
    grown = train(tmp_path, "grown", *new_data, *STILL, f"train.init_from={old.run_dir}", "train.epochs=1")
    scratch = train(tmp_path, "scratch", *new_data, *STILL, "train.epochs=1")
    before, after, fresh = (exported(run, tmp_path / f"export-{run.name}") for run in
                            (old.run_dir, grown.run_dir, scratch.run_dir))
    assert after.keys() == fresh.keys()
    counts = {"matched": 0, "added": 0, "dropped": 0}
    for file, rows in after.items():
        assert rows.keys() == fresh[file].keys(), file  # this run's vocabulary: the new data's, in its order
        known = before.get(file, {})
        for name, row in rows.items():
            expected = known[name] if name in known else fresh[file][name]
            assert np.array_equal(row, expected), (file, name)
        counts["matched"] += len(rows.keys() & known.keys())
        counts["added"] += len(rows.keys() - known.keys())
        counts["dropped"] += len(known.keys() - rows.keys())
    if task != "image":
        assert counts["added"] and counts["dropped"] and counts["matched"], counts  # the data did change
    report = grown.summary["init_from"]
    assert report["run"] == str(old.run_dir) and report["freeze"] == "none"
    if task in ("kge", "mf"):  # (every exported file is a part of the vocabulary: compare the counts)
        parts = {"kge": {"entities.tsv": "entities", "relations.tsv": "relations"},
                 "mf": {"users.tsv": "users", "items.tsv": "items"}}[task]
        for file, part in parts.items():
            rows, known = after[file], before[file]
            assert report[part] == {"matched": len(rows.keys() & known.keys()), "added": len(rows.keys() - known.keys()),
                                    "dropped": len(known.keys() - rows.keys()), "kept": 0}, part
    # the grown run records its own data's fingerprint
    state = api.final_checkpoint(RunDirectory(grown.run_dir))[1]
    assert state["data"] == api.final_checkpoint(RunDirectory(scratch.run_dir))[1]["data"]
    assert json.loads((grown.run_dir / "summary.json").read_text())["init_from"] == report


def test_the_optimizer_state_of_known_rows_comes_along(grow_data, tmp_path: Path) -> None:
    """The row-wise optimizer state of each known entity, and the dense state of each known relation,
    is the old run's; new ones start at zero."""
    old_data, new_data = grow_data["kge"]
    old = train(tmp_path, "old", *old_data, "optimizer.entity=adagrad")
    config = api.prepare_config(make_config(None, *new_data, "optimizer.entity=adagrad", f"train.init_from={old.run_dir}"))
    task = api.TASKS.get("kge")(config)
    tensors, meta = api.final_checkpoint(RunDirectory(old.run_dir))
    grown, _, growth = grow.grow(old.run_dir, tensors, meta, task, config.train, config.optimizer)
    old_entities = [line.split("\t")[1] for line in (old.run_dir / "entity_ids.tsv").read_text().splitlines()]
    old_relations = [line.split("\t")[1] for line in (old.run_dir / "relation_ids.tsv").read_text().splitlines()]
    for new_id, name in enumerate(task.graph.entity_names):
        if name in old_entities:
            assert torch.equal(grown["table.state"][new_id], tensors["table.state"][old_entities.index(name)])
        else:
            assert not grown["table.state"][new_id].any()
    for new_id, name in enumerate(task.graph.relation_names):
        if name in old_relations:
            assert torch.equal(grown["optimizer.0.sum"][new_id], tensors["optimizer.0.sum"][old_relations.index(name)])
        else:
            assert not grown["optimizer.0.sum"][new_id].any()
    assert growth.parts["entities"].added == len(set(task.graph.entity_names) - set(old_entities))


def assert_frozen(before: dict, after: dict, fresh: dict, files: tuple[str, ...], dense_trains: bool = False) -> None:
    """Every known row of ``files`` as it was; every new one moved away from its initial value."""
    moved = 0
    for file in files:
        for name, row in after[file].items():
            if name in before[file]:
                assert np.array_equal(row, before[file][name]) != (dense_trains and file == "relations.tsv"), (file, name)
            else:
                moved += not np.array_equal(row, fresh[file][name])
    assert moved, "no new row trained"


@pytest.mark.parametrize("strategy", STRATEGY_NAMES)
def test_freeze_known_trains_only_the_new_rows_under_every_strategy(strategy: str, grow_data, tmp_path: Path) -> None:
    old_data, new_data = grow_data["kge"]
    old = train(tmp_path, "old", *old_data)
    settings = [f"strategy={strategy}", *STRATEGIES.get(strategy).contract.exercised]
    grown = train(tmp_path, "grown", *new_data, *settings, f"train.init_from={old.run_dir}", "train.freeze=known",
                  "train.epochs=2")
    scratch = train(tmp_path, "scratch", *new_data, *STILL, "train.epochs=1")
    before, after, fresh = (exported(run, tmp_path / f"export-{run.name}") for run in
                            (old.run_dir, grown.run_dir, scratch.run_dir))
    assert_frozen(before, after, fresh, ("entities.tsv", "relations.tsv"))
    assert grown.summary["init_from"]["freeze"] == "known"


@pytest.mark.parametrize("task", ["ctr", "mf", "w2v"])
def test_freeze_known_for_the_other_tasks(task: str, grow_data, tmp_path: Path) -> None:
    old_data, new_data = grow_data[task]
    old = train(tmp_path, "old", *old_data)
    grown = train(tmp_path, "grown", *new_data, f"train.init_from={old.run_dir}", "train.freeze=known")
    scratch = train(tmp_path, "scratch", *new_data, *STILL, "train.epochs=1")
    before, after, fresh = (exported(run, tmp_path / f"export-{run.name}") for run in
                            (old.run_dir, grown.run_dir, scratch.run_dir))
    assert_frozen(before, after, fresh, tuple(after))


def test_freeze_dense_false_lets_the_known_relations_train(grow_data, tmp_path: Path) -> None:
    old_data, new_data = grow_data["kge"]
    old = train(tmp_path, "old", *old_data)
    grown = train(tmp_path, "grown", *new_data, f"train.init_from={old.run_dir}", "train.freeze=known",
                  "train.freeze_dense=false", "optimizer.dense=adam")
    scratch = train(tmp_path, "scratch", *new_data, *STILL, "train.epochs=1")
    before, after, fresh = (exported(run, tmp_path / f"export-{run.name}") for run in
                            (old.run_dir, grown.run_dir, scratch.run_dir))
    assert_frozen(before, after, fresh, ("entities.tsv", "relations.tsv"), dense_trains=True)


def test_frozen_dense_parameters_stay_under_adam_with_weight_decay(grow_data, tmp_path: Path) -> None:
    """CTR's dense layers under ``freeze_dense``: Adam's carried momentum and weight decay would move a
    parameter with a zero gradient; a frozen one stays bit for bit."""
    old_data, new_data = grow_data["ctr"]
    ctr = ["model.name=deepfm", "ctr.hidden=[8]", "optimizer.dense=adam", "optimizer.weight_decay=0.01"]
    old = train(tmp_path, "old", *old_data, *ctr)
    grown = train(tmp_path, "grown", *new_data, *ctr, f"train.init_from={old.run_dir}", "train.freeze=known")
    before = api.final_checkpoint(RunDirectory(old.run_dir))[0]
    after = api.final_checkpoint(RunDirectory(grown.run_dir))[0]
    dense = [k for k in before if k.startswith("dense.")]
    assert dense and all(torch.equal(before[k], after[k]) for k in dense)


@pytest.mark.parametrize("dense", [["optimizer.dense=adam"], ["optimizer.dense=sgd", "optimizer.momentum=0.9"]])
def test_frozen_relation_rows_stay_under_an_optimizer_with_momentum(dense, grow_data, tmp_path: Path) -> None:
    """KGE's relations are rows of a dense parameter: the known ones frozen, the new ones trained. The
    old run's momentum (Adam's moments, SGD's velocity) would carry a known row on with a zero
    gradient: each known relation's row stays bit for bit (issue 50: with the carried momentum not
    zeroed, a grown Adam run moved them)."""
    old_data, new_data = grow_data["kge"]
    old = train(tmp_path, "old", *old_data, *dense)
    grown = train(tmp_path, "grown", *new_data, *dense, f"train.init_from={old.run_dir}", "train.freeze=known")
    scratch = train(tmp_path, "scratch", *new_data, *STILL, "train.epochs=1")
    before, after, fresh = (exported(run, tmp_path / f"export-{run.name}") for run in
                            (old.run_dir, grown.run_dir, scratch.run_dir))
    assert before["relations.tsv"].keys() & after["relations.tsv"].keys()
    assert_frozen(before, after, fresh, ("entities.tsv", "relations.tsv"))


def test_freeze_known_resumes_with_the_same_rows_frozen(grow_data, tmp_path: Path) -> None:
    from tests.training.test_every_task_resumes import Interrupt, InterruptAt

    old_data, new_data = grow_data["kge"]
    old = train(tmp_path, "old", *old_data)
    overrides = [*new_data, f"train.init_from={old.run_dir}", "train.freeze=known", "train.epochs=3"]
    with pytest.raises(Interrupt):
        api.train(make_config(tmp_path / "grown", *overrides), hooks=[InterruptAt(2)])
    resumed = api.resume(tmp_path / "grown")
    whole = train(tmp_path, "whole", *overrides)
    assert resumed.summary["init_from"] == whole.summary["init_from"]
    before, after, other = (exported(run, tmp_path / f"export-{run.name}") for run in
                            (old.run_dir, resumed.run_dir, whole.run_dir))
    assert all(np.array_equal(after[f][n], other[f][n]) for f in after for n in after[f])
    for name, row in after["entities.tsv"].items():
        if name in before["entities.tsv"]:
            assert np.array_equal(row, before["entities.tsv"][name])


@pytest.mark.parametrize("overrides, message", [
    (["train.freeze=known"], "train.freeze: known freezes the rows of the run this one starts from"),
    (["train.freeze_dense=false"], "train.freeze_dense: read only with train.freeze: known"),
])
def test_freezing_without_a_run_to_start_from_is_refused(overrides, message, tiny_graph: Path) -> None:
    with pytest.raises(ConfigError, match=message):
        api.prepare_config(make_config(None, f"data.dataset={tiny_graph}", *overrides))


def test_what_a_grown_model_cannot_change_is_refused(grow_data, tmp_path: Path) -> None:
    old_data, new_data = grow_data["image"]
    old = train(tmp_path, "old", *old_data)
    other = write_images(tmp_path / "four", 240, 60, 5, classes=4)
    with pytest.raises(CheckpointError, match="its classes differ"):
        train(tmp_path, "grown", *[o for o in new_data if not o.startswith("data.dataset")], f"data.dataset={other}",
              f"train.init_from={old.run_dir}")
    assert not (tmp_path / "grown").exists()
    kge_old, kge_new = grow_data["kge"]
    kge = train(tmp_path, "kge", *kge_old)
    with pytest.raises(CadenceError, match="model.dim"):
        train(tmp_path, "wider", *kge_new, "model.dim=12", f"train.init_from={kge.run_dir}")
    with pytest.raises(CheckpointError, match="a run of the kge task"):
        train(tmp_path, "mf", *grow_data["mf"][1], f"train.init_from={kge.run_dir}")
    with pytest.raises(ConfigError, match="optimizer.weight_decay"):
        train(tmp_path, "decay", *kge_new, f"train.init_from={kge.run_dir}", "train.freeze=known",
              "optimizer.weight_decay=0.1")


def test_a_grown_run_of_another_model_is_refused_in_one_line_naming_both(grow_data, tmp_path: Path) -> None:
    """ComplEx rows read as DistMult's (same width: silently wrong before), as RotatE's (a shape error
    before), a DeepFM grown as an FM (its MLP dropped without a word), and an image model whose
    checkpoint holds a layer this one has not: each one line naming what differs, nothing written."""
    kge_old, kge_new = grow_data["kge"]
    complex_run = train(tmp_path, "complex", *kge_old, "model.name=complex", "model.dim=16")
    for model in ("distmult", "rotate"):
        with pytest.raises(CheckpointError, match=f"a run of model.name complex; this run's is {model}"):
            train(tmp_path, model, *kge_new, f"model.name={model}", "model.dim=16",
                  f"train.init_from={complex_run.run_dir}")
        assert not (tmp_path / model).exists()
    ctr_old, ctr_new = grow_data["ctr"]
    deepfm = train(tmp_path, "deepfm", *[o for o in ctr_old if o != "model.name=fm"], "model.name=deepfm")
    with pytest.raises(CheckpointError, match="a run of model.name deepfm; this run's is fm"):
        train(tmp_path, "fm", *ctr_new, f"train.init_from={deepfm.run_dir}")
    image_old, image_new = grow_data["image"]
    deeper = train(tmp_path, "deeper", *[o for o in image_old if not o.startswith("image.hidden")], "image.hidden=[16, 8]")
    with pytest.raises(CheckpointError, match="its model has .*which this run's has not"):
        train(tmp_path, "shallow", *image_new, f"train.init_from={deeper.run_dir}")
    assert not (tmp_path / "shallow").exists()


def test_the_old_spelling_ctr_init_from_still_works(grow_data, tmp_path: Path) -> None:
    old_data, new_data = grow_data["ctr"]
    old = train(tmp_path, "old", *old_data)
    grown = train(tmp_path, "grown", *new_data, f"ctr.init_from={old.run_dir}")
    assert grown.summary["init_from"]["run"] == str(old.run_dir)
    with pytest.raises(ConfigError, match="ctr.init_from .* and train.init_from .* differ"):
        train(tmp_path, "both", *new_data, f"ctr.init_from={old.run_dir}", f"train.init_from={tmp_path}")


def test_the_cli_prints_what_it_matched_added_and_dropped(grow_data, tmp_path: Path) -> None:
    from tests.test_cli import run_cli

    old_data, new_data = grow_data["kge"]
    old = train(tmp_path, "old", *old_data)
    done = run_cli("train", *[f"--set={item}" for item in [*new_data, "train.epochs=1", "model.dim=8"]],
                   "--init-from", str(old.run_dir), "--out", str(tmp_path / "grown"), "--no-progress")
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "grown" / "summary.json").read_text())["init_from"]
    entities, relations = report["entities"], report["relations"]
    line = (f"initialised from {old.run_dir}: entities {entities['matched']:,} matched, {entities['added']:,} added, "
            f"{entities['dropped']:,} dropped; relations {relations['matched']:,} matched")
    assert line in done.stderr + done.stdout


@pytest.mark.parametrize("task", TASKS)
def test_keep_dropped_keeps_the_rows_of_ids_the_data_lacks(task: str, grow_data, tmp_path: Path) -> None:
    """``train.keep_dropped``: every name the old run knew is in the grown model with its old row
    (the dropped ones after the data's own), new names start as in a scratch run; eval, export and a
    resume see the same vocabulary."""
    old_data, new_data = grow_data[task]
    old = train(tmp_path, "old", *old_data)
    grown = train(tmp_path, "grown", *new_data, *STILL, f"train.init_from={old.run_dir}", "train.keep_dropped=true",
                  "train.epochs=1")
    scratch = train(tmp_path, "scratch", *new_data, *STILL, "train.epochs=1")
    before, after, fresh = (exported(run, tmp_path / f"export-{run.name}") for run in
                            (old.run_dir, grown.run_dir, scratch.run_dir))
    kept = 0
    for file, rows in after.items():
        if file == "global_mean.txt":  # (MF's mean of the data's ratings: no vocabulary)
            continue
        known = before.get(file, {})
        if task != "ctr":  # (a growing table's keys are sorted)
            assert list(rows)[: len(fresh[file])] == list(fresh[file])  # the data's own ids first, in its order
        assert set(rows) == set(fresh[file]) | set(known), file
        for name, row in rows.items():
            assert np.array_equal(row, known[name] if name in known else fresh[file][name]), (file, name)
        if file in ("entities.tsv", "relations.tsv", "users.tsv", "items.tsv"):  # (a file per part)
            kept += len(set(known) - set(fresh[file]))
    report = grown.summary["init_from"]
    assert sum(v["kept"] for v in report.values() if isinstance(v, dict)) >= (1 if task != "image" else 0)
    assert all(v["dropped"] == 0 or v["kept"] == 0 for v in report.values() if isinstance(v, dict))
    if task in ("kge", "mf"):
        assert sum(v["kept"] for v in report.values() if isinstance(v, dict)) == kept
        parts = {"entities.tsv": "entities", "relations.tsv": "relations", "users.tsv": "users", "items.tsv": "items"}
        for file, part in parts.items():
            if file in after:
                ours, known = set(fresh[file]), set(before[file])
                assert report[part] == {"matched": len(ours & known), "added": len(ours - known), "dropped": 0,
                                        "kept": len(known - ours)}, part
    metric = grown.summary["primary_metric"]
    assert api.evaluate(grown.run_dir, "test")[metric] == pytest.approx(grown.summary[metric], abs=1e-6)
    resumed = api.resume(grown.run_dir, {"train.epochs": 2})
    assert exported(resumed.run_dir, tmp_path / "export-resumed").keys() == after.keys()
