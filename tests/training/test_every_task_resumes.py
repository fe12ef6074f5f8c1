"""Every task resumes after an interruption to the same model as an uninterrupted run, on both
runtimes (the parameter server under a deterministic strategy); eval and export work for every task.
The real-signal version (SIGKILL of the CLI) is in test_determinism_and_resume.py."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from cadence import api
from cadence.tasks.base import write_vectors_tsv
from cadence.training.trainer import TrainerHook
from tests.conftest import make_config
from tests.test_task_matrix import TASK_NAMES, assert_same_model

RUNTIMES = {"pipeline": ["strategy=sync"],
            "parameter_server": ["strategy=hop_bw", "ps.workers=2", "ps.backup_workers=0", "ps.shards=2"]}


class Interrupt(Exception):
    pass


class InterruptAt(TrainerHook):
    """Stops the run at the end of an epoch, before its checkpoint is written (as a kill would)."""

    def __init__(self, epoch: int):
        self.epoch = epoch

    def on_epoch_end(self, trainer, epoch: int) -> None:
        if epoch == self.epoch:
            raise Interrupt


@pytest.mark.parametrize("runtime", sorted(RUNTIMES))
@pytest.mark.parametrize("task", TASK_NAMES)
def test_interrupted_then_resumed_equals_an_uninterrupted_run(task: str, runtime: str, task_data,
                                                              tmp_path: Path) -> None:
    overrides = [*task_data[task], *RUNTIMES[runtime], "train.epochs=3", "eval.every=1"]
    whole = api.train(make_config(tmp_path / "whole", *overrides))
    with pytest.raises(Interrupt):
        api.train(make_config(tmp_path / "killed", *overrides), hooks=[InterruptAt(2)])
    assert not (tmp_path / "killed" / "summary.json").exists()
    resumed = api.resume(tmp_path / "killed")
    assert resumed.summary["runtime"] == runtime and resumed.summary["epochs"] == 3
    assert_same_model(whole.run_dir, resumed.run_dir)
    metric = whole.summary["primary_metric"]
    assert resumed.summary[metric] == whole.summary[metric]
    assert [r["epoch"] for r in resumed.metrics] == [r["epoch"] for r in whole.metrics]


@pytest.mark.parametrize("runtime", sorted(RUNTIMES))
@pytest.mark.parametrize("task", TASK_NAMES)
def test_eval_and_export_work_for_every_task(task: str, runtime: str, task_data, tmp_path: Path) -> None:
    """``eval`` reads the final checkpoint and gives the run's own test metrics, also for keys the
    run never trained (a parameter server never created their rows: they read their initial values)."""
    result = api.train(make_config(tmp_path / "run", *task_data[task], *RUNTIMES[runtime]))
    metric = result.summary["primary_metric"]
    assert api.evaluate(result.run_dir, "test")[metric] == pytest.approx(result.summary[metric], abs=1e-6)
    written = api.export(result.run_dir, tmp_path / "export", "npy")
    assert written and all(path.is_file() and path.parent == tmp_path / "export" for path in written)
    assert not [p for p in (tmp_path / "export").iterdir() if p.name.startswith(".")]  # no staging left


def read_tsv(path: Path) -> tuple[list[str], np.ndarray]:
    """Names (unescaped) and the float32 vectors of a ``--format tsv`` file, read with nothing of cadence's."""
    names, rows = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        name, *values = line.split("\t")
        names.append(re.sub(r"\\(.)", lambda m: {"t": "\t", "n": "\n", "r": "\r", "\\": "\\"}[m.group(1)], name))
        rows.append([np.float32(value) for value in values])
    return names, np.array(rows, dtype=np.float32)


def id_map(path: Path) -> list[str]:
    return [line.split("\t", 1)[1] for line in path.read_text(encoding="utf-8").splitlines()]


def ctr_names(npy: Path) -> list[str]:
    fields = id_map(npy / "fields.tsv")
    return [f"{fields[key >> 40]}={key & ((1 << 40) - 1)}" for key in np.load(npy / "feature_keys.npy").tolist()]


def image_classes(npy: Path) -> np.ndarray:
    weights = sorted(npy.glob("*.weight.npy"), key=lambda p: [int(x) if x.isdigit() else x for x in p.name.split(".")])
    last = weights[-1].name.removesuffix(".weight.npy")
    return np.concatenate([np.load(npy / f"{last}.weight.npy"), np.load(npy / f"{last}.bias.npy")[:, None]], axis=1)


# per task: (tsv file, its vectors as the npy export has them, its names as the npy export has them)
TSV_AGAINST_NPY = {
    "kge": [("entities.tsv", lambda n: np.load(n / "entity_embeddings.npy"), lambda n: id_map(n / "entity_ids.tsv"))],
    "ctr": [("features.tsv", lambda n: np.load(n / "embeddings.npy"), ctr_names),
            ("linear_weights.tsv", lambda n: np.load(n / "linear_weights.npy")[:, None], ctr_names)],
    "mf": [("users.tsv", lambda n: np.load(n / "user_factors.npy"), lambda n: id_map(n / "user_ids.tsv")),
           ("items.tsv", lambda n: np.load(n / "item_factors.npy"), lambda n: id_map(n / "item_ids.tsv")),
           ("item_biases.tsv", lambda n: np.load(n / "item_biases.npy")[:, None], lambda n: id_map(n / "item_ids.tsv"))],
    "w2v": [("vectors.tsv", lambda n: np.load(n / "vectors.npy"),
             lambda n: [line.split("\t")[0] for line in (n / "vocabulary.tsv").read_text(encoding="utf-8").splitlines()])],
    "image": [("classes.tsv", image_classes, lambda n: (n / "classes.txt").read_text(encoding="utf-8").splitlines())],
}


@pytest.mark.parametrize("task", TASK_NAMES)
def test_tsv_export_holds_the_npy_exports_rows_bit_for_bit_under_their_names(task: str, task_data,
                                                                             tmp_path: Path) -> None:
    """``export --format tsv``: each line a name and its vector; read back as float32, every vector equals
    the ``npy`` export's row exactly, under the name its id map gives that row."""
    result = api.train(make_config(tmp_path / "run", *task_data[task], "train.epochs=1"))
    npy, tsv = tmp_path / "npy", tmp_path / "tsv"
    api.export(result.run_dir, npy, "npy")
    written = api.export(result.run_dir, tsv, "tsv")
    assert all(path.parent == tsv for path in written) and {p.name for p in written} >= {
        name for name, _, _ in TSV_AGAINST_NPY[task]}
    for name, vectors, names in TSV_AGAINST_NPY[task]:
        got_names, got = read_tsv(tsv / name)
        assert got_names == names(npy), name
        expected = vectors(npy).astype(np.float32)
        assert got.shape == expected.shape and np.array_equal(got, expected), name


def test_a_tsv_name_with_tabs_newlines_and_backslashes_reads_back_whole(tmp_path: Path) -> None:
    names = ["plain", "tab\there", "line\nbreak", "back\\slash\\t", "cr\rend", "ünï cödé"]
    vectors = torch.randn(len(names), 3, generator=torch.Generator().manual_seed(0)) * 1e-3
    path = write_vectors_tsv(tmp_path / "v.tsv", names, vectors)
    assert len(path.read_text(encoding="utf-8").splitlines()) == len(names)  # one line per name
    got_names, got = read_tsv(path)
    assert got_names == names and np.array_equal(got, vectors.numpy())
