"""Similar words, analogies and similarities against numpy's cosine over the exported vectors, and
against gensim's ``KeyedVectors`` reading the same run's word2vec export (gensim in its own
virtualenv, ``.venv-bench-gensim`` at the repository's root: ``make .venv-bench-gensim/bin/python``;
the library never imports gensim)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

import cadence
from cadence import api
from cadence.errors import QueryError

pytestmark = pytest.mark.xdist_group("prediction")

GENSIM_PYTHON = Path(__file__).resolve().parents[2] / ".venv-bench-gensim" / "bin" / "python"
# (positive, negative) queries; the last two are analogies a:b :: c:? = ([b, c], [a])
QUERIES = [(["king"], []), (["cat", "dog"], []), (["money"], ["bank"]), (["queen", "boy"], ["king"]),
           (["car", "cash"], ["automobile"])]


class Vectors:
    """The exported vectors (``vectors.npy``) and words, and gensim's most_similar written out in numpy."""

    def __init__(self, run: Path, out: Path):
        api.export(run, out, "npy")
        self.vectors = np.load(out / "vectors.npy").astype(np.float64)
        self.words = [line.split("\t")[0] for line in (out / "vocabulary.tsv").read_text().splitlines()]
        self.unit = self.vectors / np.linalg.norm(self.vectors, axis=1, keepdims=True)

    def most_similar(self, positive: list[str], negative: list[str], top: int) -> list[tuple[str, float]]:
        asked = [self.words.index(word) for word in positive + negative]
        mean = sum(self.unit[self.words.index(w)] for w in positive) - sum(self.unit[self.words.index(w)]
                                                                           for w in negative)
        mean = mean / np.linalg.norm(mean)
        similarity = self.unit @ mean
        order = [i for i in sorted(range(len(self.words)), key=lambda i: (-similarity[i], i)) if i not in asked]
        return [(self.words[i], similarity[i]) for i in order[:top]]


@pytest.fixture(scope="module")
def exported(w2v_run: Path, tmp_path_factory) -> Vectors:
    return Vectors(w2v_run, tmp_path_factory.mktemp("w2v-export"))


def present(words: list[str], exported: Vectors) -> list[str]:
    missing = [word for word in words if word not in exported.words]
    assert not missing, f"the tiny corpus lacks {missing}"
    return words


@pytest.mark.parametrize("top", [1, 5, 40])
def test_most_similar_and_analogies_are_numpys_cosine(w2v_run: Path, exported: Vectors, top: int) -> None:
    model = cadence.load(w2v_run)
    for positive, negative in QUERIES:
        present(positive + negative, exported)
        answer = model.most_similar(positive, negative, top=top)
        expected = exported.most_similar(positive, negative, top)
        assert answer.columns == ("word", "similarity")
        assert answer.column("word") == [word for word, _ in expected]
        assert answer.column("similarity") == pytest.approx([s for _, s in expected], abs=1e-6)
        assert not set(answer.column("word")) & set(positive + negative)  # the query's words never
    a, b, c = "king", "queen", "boy"
    assert list(model.analogy(a, b, c, top=top)) == list(model.most_similar([b, c], [a], top=top))
    model.block_rows = 3  # a block of rows at a time: the same answer
    assert model.most_similar(["cat", "dog"], top=top).column("word") == \
        [word for word, _ in exported.most_similar(["cat", "dog"], [], top)]


def test_similarity_is_the_cosine(w2v_run: Path, exported: Vectors) -> None:
    model = cadence.load(w2v_run)
    for first, second in (("king", "queen"), ("cat", "cat"), ("money", "bank")):
        expected = exported.unit[exported.words.index(first)] @ exported.unit[exported.words.index(second)]
        assert model.similarity(first, second) == pytest.approx(expected, abs=1e-9)
    assert model.similarity("cat", "cat") == pytest.approx(1.0)
    with pytest.raises(QueryError, match="unknown word 'kitten'"):
        model.similarity("cat", "kitten")
    with pytest.raises(QueryError, match="unknown word 'kingg' \\(did you mean 'king'\\?\\)"):
        model.most_similar(["kingg"])


GENSIM_SCRIPT = """
import json, sys
from gensim.models import KeyedVectors
vectors = KeyedVectors.load_word2vec_format(sys.argv[1])
queries, top = json.loads(sys.argv[2]), int(sys.argv[3])
print(json.dumps([vectors.most_similar(positive=p, negative=n, topn=top) for p, n in queries]
                 + [[float(vectors.similarity(a, b))] for a, b in json.loads(sys.argv[4])]))
"""


@pytest.mark.skipif(not GENSIM_PYTHON.exists(), reason=f"no {GENSIM_PYTHON} (make .venv-bench-gensim/bin/python)")
def test_gensim_answers_the_same_from_the_word2vec_export(w2v_run: Path, tmp_path: Path) -> None:
    """gensim reads the text export (6 significant digits), so scores agree to 1e-5; a word may trade
    places only with one whose score is that close (which would make the order a coin toss)."""
    (path,) = api.export(w2v_run, tmp_path, "word2vec")
    top, pairs = 8, [["king", "queen"], ["cat", "money"]]
    result = subprocess.run([str(GENSIM_PYTHON), "-c", GENSIM_SCRIPT, str(path), json.dumps(QUERIES), str(top + 4),
                             json.dumps(pairs)], capture_output=True, text=True, check=True)
    *theirs, = json.loads(result.stdout)
    model = cadence.load(w2v_run)
    for (positive, negative), gensim in zip(QUERIES, theirs):
        ours = list(model.most_similar(positive, negative, top=top))
        scores = dict(map(tuple, gensim))
        assert [s for _, s in ours] == pytest.approx([s for _, s in gensim[:top]], abs=1e-5)
        for word, score in ours:
            assert scores[word] == pytest.approx(score, abs=1e-5)
        swapped = [i for i, ((word, _), (theirs_word, _)) in enumerate(zip(ours, gensim)) if word != theirs_word]
        assert all(abs(ours[i][1] - gensim[i][1]) < 1e-5 for i in swapped)
    for (first, second), (gensim,) in zip(pairs, theirs[len(QUERIES):]):
        assert model.similarity(first, second) == pytest.approx(gensim, abs=1e-5)
