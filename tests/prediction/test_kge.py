"""Link prediction by name against a brute-force sort of every entity's score, computed here with
numpy from the exported rows and each scorer's formula; the block-at-a-time path against the whole
table; triple scores from a file against the same formula."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import cadence
from cadence import api
from cadence.errors import DataError, QueryError

pytestmark = pytest.mark.xdist_group("prediction")


class Exported:
    """A run's exported rows and id maps, and its graph's known triples by name (read from its files)."""

    def __init__(self, run: Path, data: Path, out: Path):
        api.export(run, out, "npy")
        self.entities = np.load(out / "entity_embeddings.npy").astype(np.float64)
        self.relations = np.load(out / "relation_embeddings.npy").astype(np.float64)
        self.entity_names = [line.split("\t")[1] for line in (out / "entity_ids.tsv").read_text().splitlines()]
        relation_names = [line.split("\t")[1] for line in (out / "relation_ids.tsv").read_text().splitlines()]
        self.entity_id = {name: i for i, name in enumerate(self.entity_names)}
        self.relation_id = {name: i for i, name in enumerate(relation_names)}
        self.known = {tuple(line.split("\t")) for split in ("train", "valid", "test")
                      for line in (data / f"{split}.txt").read_text().splitlines()}

    def top(self, scores: np.ndarray, k: int, left_out: set[str] = frozenset()) -> list[tuple[str, float]]:
        """The k best entities by score (ties: lower id first), ``left_out`` names skipped."""
        order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
        return [(self.entity_names[i], scores[i]) for i in order if self.entity_names[i] not in left_out][:k]


def complex_parts(x: np.ndarray) -> np.ndarray:
    real, imag = np.split(x, 2, axis=-1)
    return real + 1j * imag


def complex_tail_scores(exported: Exported, head: str, relation: str) -> np.ndarray:
    """Re(sum_k h_k r_k conj(t_k)) for every entity t (Trouillon et al. 2016)."""
    h = complex_parts(exported.entities[exported.entity_id[head]])
    r = complex_parts(exported.relations[exported.relation_id[relation]])
    return np.real(complex_parts(exported.entities).conj() @ (h * r))


def complex_head_scores(exported: Exported, relation: str, tail: str) -> np.ndarray:
    r = complex_parts(exported.relations[exported.relation_id[relation]])
    t = complex_parts(exported.entities[exported.entity_id[tail]])
    return np.real(complex_parts(exported.entities) @ (r * t.conj()))


@pytest.fixture(scope="module")
def exported(kge_run: Path, kge_data: Path, tmp_path_factory) -> Exported:
    return Exported(kge_run, kge_data, tmp_path_factory.mktemp("kge-export"))


QUERIES = [("e1", "r2"), ("e7", "r0"), ("e22", "r3")]


def assert_same(answer, expected: list[tuple[str, float]]) -> None:
    assert [row[0] for row in answer] == [name for name, _ in expected]
    assert [row[1] for row in answer] == pytest.approx([score for _, score in expected], rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("filtered", [False, True])
@pytest.mark.parametrize("top", [1, 5, 30])
def test_tails_and_heads_are_every_entitys_scores_sorted(kge_run: Path, exported: Exported, filtered: bool,
                                                         top: int) -> None:
    model = cadence.load(kge_run)
    for anchor, relation in QUERIES:
        tails = model.tails(anchor, relation, top=top, filtered=filtered)
        known_tails = {t for h, r, t in exported.known if (h, r) == (anchor, relation)}
        assert_same(tails, exported.top(complex_tail_scores(exported, anchor, relation), top,
                                        known_tails if filtered else set()))
        assert [row[2] for row in tails] == [row[0] in known_tails for row in tails]
        heads = model.heads(relation, anchor, top=top, filtered=filtered)
        known_heads = {h for h, r, t in exported.known if (r, t) == (relation, anchor)}
        assert_same(heads, exported.top(complex_head_scores(exported, relation, anchor), top,
                                        known_heads if filtered else set()))
        assert [row[2] for row in heads] == [row[0] in known_heads for row in heads]
        if filtered:
            assert not any(row[2] for row in tails) and not any(row[2] for row in heads)


def test_a_query_with_known_answers_lists_them_unless_filtered(kge_run: Path, exported: Exported) -> None:
    """(the queries above do have known answers: the filter is tested on something)"""
    model = cadence.load(kge_run)
    head, relation, tail = sorted(exported.known)[0]
    assert tail in model.tails(head, relation, top=30).column("tail")
    assert tail not in model.tails(head, relation, top=30, filtered=True).column("tail")
    assert len(model.tails(head, relation, top=30, filtered=True)) < 30


@pytest.mark.parametrize("block", [1, 4, 7])
def test_a_block_at_a_time_equals_the_whole_table(kge_run: Path, kge_reciprocal_run: Path, block: int) -> None:
    for run in (kge_run, kge_reciprocal_run):
        whole, blocks = cadence.load(run), cadence.load(run)
        assert whole.block_rows >= 30
        blocks.block_rows = block
        for anchor, relation in QUERIES:
            for ask in (lambda m: m.tails(anchor, relation, top=12), lambda m: m.heads(relation, anchor, top=12),
                        lambda m: m.tails(anchor, relation, top=12, filtered=True)):
                expected, answer = ask(whole), ask(blocks)
                assert answer.column(answer.columns[0]) == expected.column(expected.columns[0])
                assert answer.column("score") == pytest.approx(expected.column("score"), rel=1e-6, abs=1e-7)


def test_a_reciprocal_run_asks_heads_of_the_inverse_relation(kge_reciprocal_run: Path, kge_data: Path,
                                                             tmp_path: Path) -> None:
    """DistMult with reciprocal relations: (?, r, t) is scored as (t, r^-1, ?), as evaluation ranks heads."""
    exported = Exported(kge_reciprocal_run, kge_data, tmp_path / "export")
    model = cadence.load(kge_reciprocal_run)
    inverse = exported.relations[exported.relation_id["r1"] + len(exported.relation_id)]
    for tail in ("e3", "e11"):
        scores = exported.entities @ (exported.entities[exported.entity_id[tail]] * inverse)
        assert_same(model.heads("r1", tail, top=8), exported.top(scores, 8))


def test_scores_of_a_file_of_triples_are_the_formulas(kge_run: Path, kge_data: Path, exported: Exported,
                                                      tmp_path: Path) -> None:
    model = cadence.load(kge_run)
    path = tmp_path / "asked.txt"
    asked = [("e1", "r2", "e5"), ("e22", "r3", "e22"), *sorted(exported.known)[:5]]
    path.write_text("".join("\t".join(triple) + "\n" for triple in asked))
    answer = model.score_file(path)
    assert answer.columns == ("head", "relation", "tail", "score", "known")
    assert [row[:3] for row in answer] == asked
    expected = [complex_tail_scores(exported, h, r)[exported.entity_id[t]] for h, r, t in asked]
    assert answer.column("score") == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert answer.column("known") == [triple in exported.known for triple in asked]
    assert list(model.scores(asked)) == list(answer)


def test_a_bad_line_or_an_unknown_name_in_a_file_names_its_line(kge_run: Path, tmp_path: Path) -> None:
    model = cadence.load(kge_run)
    path = tmp_path / "asked.txt"
    path.write_text("e1\tr2\te5\ne1\tr2\n")
    with pytest.raises(DataError, match=f"^{path}:2: expected 3 tab-separated fields"):
        model.score_file(path)
    path.write_text("e1\tr2\te5\n\ne1\tr9\te5\n")
    with pytest.raises(DataError, match=f"^{path}:3: unknown relation 'r9'"):
        model.score_file(path)
    with pytest.raises(QueryError, match="unknown entity 'nobody'"):
        model.scores([("e1", "r2", "nobody")])


def test_names_and_kinds(kge_run: Path, exported: Exported) -> None:
    model = cadence.load(kge_run)
    assert model.task == "kge" and model.config.model.name == "complex"
    assert model.kinds == ("entities", "relations")
    assert list(model.names("entities")) == exported.entity_names
    assert list(model.names("relations")) == sorted(exported.relation_id, key=exported.relation_id.get)
    with pytest.raises(QueryError, match="names entities, relations; not 'words'"):
        model.names("words")
    with pytest.raises(QueryError, match="top must be"):
        model.tails("e1", "r2", top=0)
