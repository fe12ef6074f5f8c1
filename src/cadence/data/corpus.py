"""Text corpora for word2vec (``task: w2v``), their vocabulary, and the registry of corpora.

A corpus is a sequence of sentences, a sentence a sequence of word tokens. Sources:

- ``gcide``: the Collaborative International Dictionary of English (Webster's 1913 + WordNet 1.5),
  from Debian's ``dict-gcide`` package (fetched with ``apt-get download``, never installed:
  the ``.deb`` is an ``ar`` archive read here, its ``data.tar.xz`` read with ``tarfile``, and
  ``usr/share/dictd/gcide.dict.dz`` is gzip). All of the dictd text is kept, headers,
  pronunciations and source tags (``[1913 Webster]``) included: 5,417,136 tokens, 216,930
  distinct words (46,618 with min_count 5).
- ``enwiki-excerpt``: the 106 English Wikipedia articles (namespace 0, redirects skipped) of
  ``enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2`` in the ``gensim==4.4.0``
  wheel's test data. Wiki markup is removed first: comments, ``<ref>``/``<math>``/... elements,
  templates ``{{..}}`` and tables ``{|..|}`` (with their content), File/Image/Category and
  interlanguage links; other links and external links keep their text; HTML tags and entities.
  447,345 tokens (the raw XML has ~0.7M whitespace-separated words, markup included).
- a user's text file given by path: UTF-8, one sentence per line, tokens separated by
  whitespace and kept as they are except for lowercasing; blank lines are skipped.

Tokens of the registered corpora (``letter_tokens``): the text is lowercased, and a token is a
maximal run of Unicode letters (regex ``[^\\W\\d_]+``, i.e. word characters other than digits and
``_``). Everything else (digits, punctuation, markup characters, whitespace) separates tokens and is
dropped: ``"Don't"`` -> ``don t``, ``"well-known"`` -> ``well known``, ``"A4"`` -> ``a``. A sentence
is a paragraph: in the dictionary a block of lines between blank lines, in Wikipedia a line of an
article. A fetch tokenises once and writes ``corpus.txt`` (one sentence per line, tokens separated
by one space) under ``$CADENCE_HOME/datasets/<name>/``, so loading a registered corpus reads the
same format as a user's file, and ``corpus.txt`` is the file a word2vec peer (gensim) trains on.
Fetching writes to a temporary directory renamed into place: nothing is ever half-written.

Vocabulary (``build_corpus``), as word2vec.c and gensim build it: words occurring fewer than
``min_count`` times are dropped, and their tokens removed from the sentences (the neighbours close
up); the vocabulary is sorted by count, descending, ties in order of first appearance;
``max_vocab > 0`` then keeps only the first ``max_vocab`` words.
"""

from __future__ import annotations

import bz2
import gzip
import html
import io
import re
from array import array
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from xml.etree import ElementTree

import torch
from torch import Tensor

from cadence.data import fetch as fetching
from cadence.data.fetch import DebianPackage, debian_member  # noqa: F401  (re-exported)
from cadence.data.text import numbered_lines
from cadence.errors import ConfigError, DataError
from cadence.registry import Registry

CORPUS_FILE = "corpus.txt"
_LETTERS = re.compile(r"[^\W\d_]+")


@dataclass
class Corpus:
    name: str
    words: list[str]         # the vocabulary: word of id i, by count descending
    counts: Tensor           # [V] int64 occurrences of each word
    tokens: Tensor           # [T] int64 word ids of all in-vocabulary tokens, corpus order
    sentence_starts: Tensor  # [S + 1] int64: sentence s is tokens[starts[s]:starts[s + 1]] (may be empty)
    index: dict[str, int]    # word -> id
    total_words: int         # raw tokens, out-of-vocabulary ones included


def letter_tokens(text: str) -> list[str]:
    """The lowercased maximal runs of letters of ``text`` (see the module docstring)."""
    return _LETTERS.findall(text.lower())


def build_corpus(sentences: Iterable[Sequence[str]], min_count: int, max_vocab: int = 0,
                 name: str = "corpus") -> Corpus:
    """Number the words of ``sentences`` (an iterable, read once) and drop the rare ones.

    One pass maps each token to the index of its word's first appearance (a C-level dict lookup);
    counting, sorting and the removal of out-of-vocabulary tokens are tensor operations.
    """
    first_seen: defaultdict[str, int] = defaultdict()
    first_seen.default_factory = first_seen.__len__  # a new word gets the next index
    ids, lengths = array("q"), array("q")
    for sentence in sentences:
        ids.extend(map(first_seen.__getitem__, sentence))
        lengths.append(len(sentence))
    raw = torch.frombuffer(ids, dtype=torch.int64) if ids else torch.zeros(0, dtype=torch.int64)
    raw_counts = torch.bincount(raw, minlength=len(first_seen))
    order = torch.sort(raw_counts, descending=True, stable=True).indices  # ties: first appearance
    order = order[raw_counts[order] >= min_count]
    if max_vocab > 0:
        order = order[:max_vocab]
    remap = torch.full((len(first_seen),), -1, dtype=torch.int64)
    remap[order] = torch.arange(order.shape[0])
    mapped = remap[raw]
    inside = mapped >= 0
    raw_starts = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    if lengths:
        raw_starts[1:] = torch.cumsum(torch.frombuffer(lengths, dtype=torch.int64), 0)
    kept_before = torch.zeros(raw.shape[0] + 1, dtype=torch.int64)
    kept_before[1:] = torch.cumsum(inside, 0)
    types = list(first_seen)
    words = [types[i] for i in order.tolist()]
    return Corpus(name, words, raw_counts[order], mapped[inside], kept_before[raw_starts],
                  {word: i for i, word in enumerate(words)}, raw.shape[0])


def keep_probabilities(counts: Tensor, sample: float) -> Tensor:
    """[V] float64: the probability that subsampling keeps one token of each word.

    word2vec.c and gensim: with ``t = sample * sum(counts)`` (the in-vocabulary total),
    ``p(w) = min(1, (sqrt(c_w / t) + 1) * t / c_w)``; ``sample = 0`` keeps everything. (gensim stores
    ``p`` as ``uint32(p * (2**32 - 1))`` and keeps a token when that exceeds a random uint32.)
    """
    counts = counts.to(torch.float64)
    if sample == 0:
        return torch.ones_like(counts)
    if not 0 < sample < 1:
        raise ConfigError(f"the subsampling threshold must be in [0, 1) (a fraction of the corpus), got {sample}")
    threshold = sample * counts.sum()
    return (((counts / threshold).sqrt() + 1) * threshold / counts).clamp(max=1.0)


def noise_distribution(counts: Tensor, power: float = 0.75) -> Tensor:
    """[V] float64: the negative-sampling distribution ``c_w^power / sum_v c_v^power`` (word2vec's
    unigram table, gensim's ``cum_table`` before its cumulative sum)."""
    weights = counts.to(torch.float64) ** power
    return weights / weights.sum()


# --- reading ---------------------------------------------------------------------------------------

def read_sentences(path: str | Path) -> Iterator[list[str]]:
    """The lowercased whitespace-separated tokens of each non-blank line of a UTF-8 file."""
    missing = "file not found (a corpus is a registered name or a UTF-8 text file, one sentence per line)"
    for _, line in numbered_lines(path, missing):
        words = line.lower().split()
        if words:
            yield words


def read_text_corpus(path: str | Path, min_count: int, max_vocab: int = 0, name: str | None = None) -> Corpus:
    path = Path(path)
    corpus = build_corpus(read_sentences(path), min_count, max_vocab, name or path.stem)
    if corpus.total_words == 0:
        raise DataError("the corpus is empty (no words)", path)
    return corpus


# --- the registry ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class CorpusEntry:
    name: str
    description: str
    source: str                            # the pinned origin of the text, for `cadence data list`
    write_sentences: Callable[[], Iterator[list[str]]]  # downloads and tokenises the source

    def fetch(self) -> Path:
        """Make ``dataset_dir(name)/corpus.txt`` exist; return that directory."""

        def write(staging: Path) -> None:
            with open(staging / CORPUS_FILE, "w", encoding="utf-8") as handle:
                handle.writelines(" ".join(sentence) + "\n" for sentence in self.write_sentences() if sentence)

        return fetching.publish(self.name, write, self.is_fetched)

    def is_fetched(self) -> bool:
        return (fetching.dataset_dir(self.name) / CORPUS_FILE).is_file()

    def load(self, min_count: int, max_vocab: int = 0) -> Corpus:
        return read_text_corpus(self.fetch() / CORPUS_FILE, min_count, max_vocab, self.name)


CORPORA: Registry[CorpusEntry] = Registry("corpus")


def load_corpus(name_or_path: str, min_count: int, max_vocab: int = 0) -> Corpus:
    """A registered corpus, or a user's text file given by path (see the module docstring)."""
    if name_or_path in CORPORA:
        return CORPORA.get(name_or_path).load(min_count, max_vocab)
    path = Path(name_or_path).expanduser()
    if path.is_file() or "/" in name_or_path or name_or_path.startswith(".") or path.suffix:
        return read_text_corpus(path, min_count, max_vocab)
    CORPORA.get(name_or_path)  # raises with the list of names and a close match
    raise AssertionError("unreachable")


# --- gcide: a Debian package, unpacked in Python ---------------------------------------------------

DICT_GCIDE = DebianPackage("dict-gcide", "0.48.5+nmu2",
                           "7b0af5cfde3cbdef5e9d6e78f92ec335ced7c2790f37a40f49bebc6f7347ac0f",
                           "usr/share/dictd/gcide.dict.dz")


def gcide_sentences() -> Iterator[list[str]]:
    # 3 stray cp1252 bytes in the otherwise ASCII text decode to U+FFFD, which is no letter
    text = gzip.decompress(debian_member(DICT_GCIDE)).decode("utf-8", errors="replace")
    for paragraph in re.split(r"\n[ \t\r]*\n", text):
        yield letter_tokens(paragraph)


# --- enwiki-excerpt and the word-vector benchmarks: the gensim wheel's test data -------------------

GENSIM_WHEEL = ("gensim", "4.4.0", "91a7fa5e814e7b1bad4b2dffa8d62c1e55410d5cbdf930714c1997ffb4404db8")
GENSIM_BUILD = ("3.11", "manylinux_2_28_x86_64")  # the CPython 3.11 x86-64 wheel whose sha256 is pinned
_TEST_DATA = "gensim/test/test_data/"
ENWIKI_EXCERPT = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
GENSIM_TEST_FILES = ("wordsim353.tsv", "simlex999.txt", "questions-words.txt", ENWIKI_EXCERPT)


def gensim_test_data() -> Path:
    """The directory holding ``GENSIM_TEST_FILES``, from the pinned gensim wheel (one fetch).

    The wheel is the CPython 3.11 manylinux x86-64 build (``GENSIM_BUILD``), fetched as such whatever
    the interpreter and machine: only its data files are read.
    """
    package, version, sha256 = GENSIM_WHEEL
    members = {_TEST_DATA + name: name for name in GENSIM_TEST_FILES}
    source = fetching.WheelSource(package, version, sha256, members, build=GENSIM_BUILD)
    return fetching.fetch("gensim-test-data", source)


def enwiki_sentences() -> Iterator[list[str]]:
    xml = bz2.decompress((gensim_test_data() / ENWIKI_EXCERPT).read_bytes())
    for article in wikipedia_articles(xml):
        for line in strip_wiki_markup(article).splitlines():
            yield letter_tokens(line)


def wikipedia_articles(xml: bytes) -> Iterator[str]:
    """The wiki text of each article of a MediaWiki XML dump (namespace 0, not a redirect)."""
    for _, element in ElementTree.iterparse(io.BytesIO(xml)):
        if element.tag.rpartition("}")[2] != "page":
            continue
        text = element.findtext("{*}revision/{*}text")
        if element.findtext("{*}ns") == "0" and element.find("{*}redirect") is None and text:
            yield text
        element.clear()


_COMMENT = re.compile(r"<!--.*?-->", re.S)
_DROPPED_ELEMENT = re.compile(r"<(ref|math|nowiki|gallery|timeline|score|source|syntaxhighlight)\b[^>]*?"
                              r"(?:/>|>.*?</\1\s*>)", re.S | re.I)
_TEMPLATE = re.compile(r"\{\{[^{}]*\}\}")  # innermost first, until none is left
_TABLE = re.compile(r"\{\|(?:(?!\{\|).)*?\|\}", re.S)
_LINK = re.compile(r"\[\[([^\[\]]*)\]\]")
_EXTERNAL_LINK = re.compile(r"\[(?:https?|ftp)://[^\s\]]*\s*([^\]]*)\]")
_URL = re.compile(r"(?:https?|ftp)://\S+")
_TAG = re.compile(r"<[^>]*>")
_DROPPED_NAMESPACES = {"file", "image", "category"}


def strip_wiki_markup(text: str) -> str:
    """Plain text of an article's wiki markup (what is removed: see the module docstring)."""
    text = _DROPPED_ELEMENT.sub("", _COMMENT.sub("", html.unescape(text)))
    for pattern, replacement in ((_TEMPLATE, ""), (_TABLE, ""), (_LINK, _link_text)):
        count = 1
        while count:
            text, count = pattern.subn(replacement, text)
    text = _URL.sub("", _EXTERNAL_LINK.sub(r"\1", text))
    return _TAG.sub("", text)


def _link_text(match: re.Match) -> str:
    target, bar, label = match.group(1).partition("|")
    namespace, colon, _ = target.lstrip(":").partition(":")
    if colon and (namespace.strip().lower() in _DROPPED_NAMESPACES or not bar):
        return ""  # File/Image/Category, interlanguage and interwiki links
    return label.rpartition("|")[2] if bar else target


CORPORA.register("gcide")(CorpusEntry(
    "gcide", "GCIDE dictionary text (Webster 1913 + WordNet): 5.4M tokens, 253k paragraphs",
    f"debian:{DICT_GCIDE.name}={DICT_GCIDE.version}", gcide_sentences,
))
CORPORA.register("enwiki-excerpt")(CorpusEntry(
    "enwiki-excerpt", "106 English Wikipedia articles (gensim's test data): 0.45M tokens, 11.5k paragraphs",
    "pypi:{}=={}".format(*GENSIM_WHEEL[:2]), enwiki_sentences,
))
