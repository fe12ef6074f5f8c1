"""word2vec corpora: tokens, vocabulary, subsampling and noise formulas, readers, fetchers."""

import hashlib
import io
import math
import random
import tarfile
from pathlib import Path

import pytest
import torch

from cadence.data import corpus as corpora
from cadence.data import fetch as fetching
from cadence.data.corpus import (CORPORA, CorpusEntry, DebianPackage, build_corpus, keep_probabilities,
                                 letter_tokens, load_corpus, noise_distribution, strip_wiki_markup)
from cadence.errors import ConfigError, DataError, FetchError


def test_letter_tokens_keep_lowercased_runs_of_letters() -> None:
    text = "Don't stop: A4 well-known Café_x 12 [1913 Webster] \\Af*fect\"\\ Éclair"
    assert letter_tokens(text) == ["don", "t", "stop", "a", "well", "known", "café", "x", "webster",
                                   "af", "fect", "éclair"]


def test_vocabulary_is_sorted_by_count_then_first_appearance() -> None:
    corpus = build_corpus([["b", "a", "c", "a"], ["c", "d", "b"], ["a", "e"]], min_count=1)
    assert corpus.words == ["a", "b", "c", "d", "e"]  # a:3, then b and c (2 each) in order of appearance
    assert corpus.counts.tolist() == [3, 2, 2, 1, 1]
    assert corpus.index == {"a": 0, "b": 1, "c": 2, "d": 3, "e": 4}
    assert corpus.tokens.tolist() == [1, 0, 2, 0, 2, 3, 1, 0, 4]
    assert corpus.sentence_starts.tolist() == [0, 4, 7, 9]
    assert corpus.total_words == 9


def test_min_count_removes_rare_tokens_and_sentences_close_up() -> None:
    corpus = build_corpus([["b", "a", "c", "a"], ["x", "c", "y", "b"], ["z"], ["a", "w"]], min_count=2)
    assert corpus.words == ["a", "b", "c"]
    assert [corpus.words[i] for i in corpus.tokens] == ["b", "a", "c", "a", "c", "b", "a"]
    assert corpus.sentence_starts.tolist() == [0, 4, 6, 6, 7]  # the third sentence is now empty
    assert corpus.total_words == 11 and corpus.tokens.dtype == torch.int64


def test_max_vocab_keeps_the_most_frequent_words() -> None:
    corpus = build_corpus([["a", "b", "b", "c", "c", "c"]], min_count=1, max_vocab=2)
    assert corpus.words == ["c", "b"] and corpus.tokens.tolist() == [1, 1, 0, 0, 0]
    assert build_corpus([], min_count=1).words == []


def test_keep_probabilities_match_the_word2vec_formula_word_by_word() -> None:
    rng = random.Random(0)
    counts = torch.tensor([rng.choice([1, 3, 40, 900, 25_000]) for _ in range(200)])
    total, sample = int(counts.sum()), 1e-3
    expected = []
    # word2vec.c: ran = (sqrt(cn / (sample * train_words)) + 1) * (sample * train_words) / cn
    for count in counts.tolist():
        threshold = sample * total
        expected.append(min(1.0, (math.sqrt(count / threshold) + 1) * threshold / count))
    got = keep_probabilities(counts, sample)
    assert got.dtype == torch.float64
    assert torch.allclose(got, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=0)
    assert (got < 1).any() and (got == 1).any()
    assert torch.equal(keep_probabilities(counts, 0.0), torch.ones(200, dtype=torch.float64))
    with pytest.raises(ConfigError, match="subsampling"):
        keep_probabilities(counts, 2.0)


def test_noise_distribution_is_the_normalised_unigram_power() -> None:
    counts = torch.tensor([16, 1, 81])
    weights = [16 ** 0.75, 1.0, 81 ** 0.75]
    expected = torch.tensor([w / sum(weights) for w in weights], dtype=torch.float64)
    assert torch.allclose(noise_distribution(counts), expected, rtol=1e-12, atol=0)


def test_user_file_is_whitespace_tokenised_and_lowercased(tmp_path: Path) -> None:
    path = tmp_path / "my-text.txt"
    path.write_text("The cat  sat\n\n  the Dog's bone, \t sat\nTHE end\n", encoding="utf-8")
    corpus = load_corpus(str(path), min_count=1)
    assert corpus.name == "my-text"
    assert corpus.words == ["the", "sat", "cat", "dog's", "bone,", "end"]
    assert corpus.sentence_starts.tolist() == [0, 3, 7, 9]  # the blank line is no sentence


def test_user_file_errors_name_file_and_line(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="file not found"):
        load_corpus(str(tmp_path / "missing.txt"), min_count=1)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    with pytest.raises(DataError, match="empty"):
        load_corpus(str(empty), min_count=1)
    broken = tmp_path / "broken.txt"
    broken.write_bytes("fine words\ncaf\xe9 ok\n".encode("utf-8") + b"bad \xff byte\n")
    with pytest.raises(DataError) as caught:
        load_corpus(str(broken), min_count=1)
    assert (caught.value.path, caught.value.line) == (str(broken), 3) and "UTF-8" in str(caught.value)


def test_unknown_corpus_name_suggests_a_registered_one() -> None:
    assert {"gcide", "enwiki-excerpt"} <= set(CORPORA)
    with pytest.raises(ConfigError, match=r"unknown corpus 'gcid' \(did you mean 'gcide'\?\)"):
        load_corpus("gcid", min_count=5)


def test_an_interrupted_fetch_leaves_nothing(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("CADENCE_HOME", str(tmp_path))

    def sentences():
        yield ["a", "b"]
        raise FetchError("network down")

    entry = CorpusEntry("half", "a corpus whose source fails midway", "test", sentences)
    with pytest.raises(FetchError):
        entry.fetch()
    assert not entry.is_fetched() and list((tmp_path / "datasets").iterdir()) == []
    good = CorpusEntry("whole", "a corpus", "test", lambda: iter([["a", "b"], [], ["c"]]))
    assert (good.fetch() / "corpus.txt").read_text() == "a b\nc\n" and good.is_fetched()
    assert good.load(min_count=1).words == ["a", "b", "c"]


def _deb(files: dict[str, bytes]) -> bytes:
    """A minimal Debian package: an ar archive of debian-binary, control.tar.xz, data.tar.xz."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:xz") as archive:
        for name, body in files.items():
            info = tarfile.TarInfo("./" + name)
            info.size = len(body)
            archive.addfile(info, io.BytesIO(body))
    out = bytearray(b"!<arch>\n")
    for name, body in (("debian-binary", b"2.0\n"), ("control.tar.xz", b"odd"), ("data.tar.xz", data.getvalue())):
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(body):<10}`\n".encode()
        out += body + (b"\n" if len(body) % 2 else b"")
    return bytes(out)


def test_a_placed_debian_package_is_checked_and_unpacked_without_apt(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("CADENCE_HOME", str(tmp_path))
    deb = _deb({"usr/share/doc/x/copyright": b"c", "usr/share/dictd/tiny.dict": b"hello dictionary"})
    package = DebianPackage("dict-tiny", "1.0", hashlib.sha256(deb).hexdigest(), "usr/share/dictd/tiny.dict")
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    (downloads / package.filename).write_bytes(deb)
    monkeypatch.setattr(fetching.subprocess, "run", lambda *a, **k: pytest.fail("apt-get must not run"))
    assert corpora.debian_member(package) == b"hello dictionary"


def test_without_apt_the_error_says_where_to_put_the_package(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("CADENCE_HOME", str(tmp_path))

    def no_apt(*args, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", "apt-get")

    monkeypatch.setattr(fetching.subprocess, "run", no_apt)
    (tmp_path / "downloads").mkdir()
    (tmp_path / "downloads" / "dict-gcide_0.48.5+nmu2_all.deb").write_bytes(b"not the package")
    with pytest.raises(FetchError) as caught:
        CORPORA.get("gcide").fetch()
    message = str(caught.value)
    assert "apt-get is not available" in message and corpora.DICT_GCIDE.sha256 in message
    assert str(tmp_path / "downloads" / "dict-gcide_0.48.5+nmu2_all.deb") in message
    assert "do(es) not match" in message
    assert not (tmp_path / "datasets" / "gcide").exists()


def test_wiki_markup_is_stripped() -> None:
    text = ("'''Anarchism''' is a [[political philosophy]]<ref name=a>Cite {{x}}</ref> that "
            "[[Stateless society|advocates]] {{Infobox|a={{b}}}} self-governed<!-- note --> "
            "[http://example.org societies] http://bare.url.org.\n"
            "[[File:A.jpg|thumb|A [[caption]] here]]{|\n| cell\n|}\n[[Category:Anarchism]][[de:Anarchismus]]"
            "&lt;b&gt;bold&lt;/b&gt; &amp; more")
    assert letter_tokens(strip_wiki_markup(text)) == [
        "anarchism", "is", "a", "political", "philosophy", "that", "advocates", "self", "governed",
        "societies", "bold", "more"]


def test_enwiki_excerpt_from_the_gensim_wheel() -> None:
    corpus = load_corpus("enwiki-excerpt", min_count=5)
    assert corpus.name == "enwiki-excerpt"
    assert corpus.total_words == 447_345 and corpus.sentence_starts.shape[0] - 1 == 11_534
    assert corpus.words[:3] == ["the", "of", "and"] and len(corpus.words) == 8_538
    assert int(corpus.counts.sum()) == corpus.tokens.shape[0]


@pytest.mark.slow
def test_gcide_from_the_debian_package(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("CADENCE_HOME", str(tmp_path))  # a real download with apt-get
    corpus = load_corpus("gcide", min_count=5)
    assert (tmp_path / "downloads" / corpora.DICT_GCIDE.filename).is_file()
    assert corpus.total_words == 5_417_136 and len(corpus.words) == 46_618
    assert corpus.words[:4] == ["a", "the", "webster", "of"]
    assert corpus.tokens.shape[0] == int(corpus.counts.sum()) == 5_148_823


@pytest.mark.parametrize("package", [corpora.DICT_GCIDE, "wordnet", "fashion-mnist"])
def test_the_fallback_names_the_archive_s_own_path(package, tmp_path: Path, monkeypatch) -> None:
    """Without apt-get, the error names where a mirror keeps the file: the source package's pool
    directory, the file name without the version's epoch (WordNet's ``1:3.0-37``) — checked against
    apt's own record of the package where apt is here, against the archive's known path otherwise."""
    import shutil
    import subprocess

    from cadence.data import images, wordnet

    package = {"wordnet": wordnet.WORDNET_BASE, "fashion-mnist": images.FASHION_MNIST}.get(package, package)
    known = {"dict-gcide": "pool/main/d/dict-gcide/dict-gcide_0.48.5+nmu2_all.deb",
             "wordnet-base": "pool/main/w/wordnet/wordnet-base_3.0-37_all.deb",
             "dataset-fashion-mnist": "pool/main/d/dataset-fashion-mnist/"
                                      "dataset-fashion-mnist_0.0~git20200523.55506a9-1_all.deb"}[package.name]
    if shutil.which("apt-cache"):
        shown = subprocess.run(["apt-cache", "show", f"{package.name}={package.version}"], capture_output=True, text=True)
        recorded = [line.split(": ", 1)[1] for line in shown.stdout.splitlines() if line.startswith("Filename: ")]
        if recorded:
            assert recorded[0] == known
    monkeypatch.setenv("CADENCE_HOME", str(tmp_path))

    def no_apt(*args, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", "apt-get")

    monkeypatch.setattr(fetching.subprocess, "run", no_apt)
    with pytest.raises(FetchError) as caught:
        fetching.debian_members(package, [])
    message = str(caught.value)
    assert package.pool + package.filename == known
    assert f"({package.pool})" in message and str(tmp_path / "downloads" / package.filename) in message
