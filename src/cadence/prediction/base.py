"""What every predictor shares: the answer (``Prediction``), the names a run knows (``Names``), the
questions a predictor answers on the command line (``Query``) and the predictor's interface.

    model = cadence.load("runs/umls")            # the predictor of the run's task (``Task.predictor``)
    model.task, model.config, model.kinds        # "kge", the run's config, ("entities", "relations")
    model.names("entities")                      # every entity's name, by id
    model.tails("virus", "causes", top=5)        # a Prediction: columns ("tail", "score", "known"), rows
    list(model.tails("virus", "causes"))         # [("disease_or_syndrome", 9.7, True), ...]

A method means the same on every task that has it (``names``, ``kinds``, ``top=``: how many answers);
a name the model does not know is a ``QueryError`` naming it, never a wrong answer.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterator, Sequence

from cadence.config import Config
from cadence.data.text import TSV_DIGITS, tsv_name
from cadence.errors import QueryError

SUGGESTED_UP_TO = 100_000  # names compared for a "did you mean" (each comparison is a string match)


@dataclass(frozen=True)
class Prediction:
    """A predictor's answer: named columns and one row per answer, the best first where answers are
    ranked. Iterating gives the rows (tuples), as gensim's ``most_similar`` gives its pairs."""

    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self.rows)

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        return self.rows[index]

    def column(self, name: str) -> list[Any]:
        """Every row's value in column ``name``."""
        if name not in self.columns:
            raise QueryError(f"no column {name!r}; the columns are {', '.join(self.columns)}")
        index = self.columns.index(name)
        return [row[index] for row in self.rows]

    def tsv(self) -> str:
        """The answer as TSV text: a line of the column names, then a line per row (names escaped as
        ``tsv_name`` does, numbers with 9 significant digits, truth values as ``yes``/``no``)."""
        lines = ["\t".join(self.columns)]
        lines += ["\t".join(map(tsv_field, row)) for row in self.rows]
        return "\n".join(lines) + "\n"


def tsv_field(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return TSV_DIGITS % value
    return tsv_name(value)


class Names:
    """The names of one kind of row (a run's entities, words, users...), by id, and the id of each
    name; a name the run does not know is a ``QueryError`` that names it. ``source``: the task's own
    sequence (a graph's names, a ``range`` where it has none), read as strings; the look-up index is
    built at the first look-up."""

    def __init__(self, kind: str, plural: str, source: Sequence[Any]):
        self.kind, self.plural, self.source = kind, plural, source
        self.index: dict[str, int] | None = None

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, id: int) -> str:
        return str(self.source[id])

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(map(str, self.source))

    def id(self, name: str) -> int:
        if self.index is None:
            self.index = {str(known): id for id, known in enumerate(self.source)}
        found = self.index.get(name)
        if found is None:
            hint = difflib.get_close_matches(name, self.index, n=1) if len(self) <= SUGGESTED_UP_TO else []
            suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise QueryError(f"unknown {self.kind} {name!r}{suggestion}: not among the run's {len(self):,} "
                             f"{self.plural}")
        return found

    def ids(self, names: Sequence[str]) -> list[int]:
        return [self.id(name) for name in names]


@dataclass(frozen=True)
class Query:
    """A question a predictor answers on the command line, ``cadence predict RUN VERB ARGUMENTS``:
    ``answer`` is the predictor's method, called with the arguments in order (a last metavar ending in
    ``...`` takes one or more, as a list) and the keyword options it names in ``options``. ``value``:
    the method returns one number, shown as a row of the arguments and that number in column ``value``."""

    verb: str
    answer: Callable[..., Any]
    arguments: tuple[str, ...]
    options: tuple[str, ...] = ()
    value: str | None = None

    @property
    def usage(self) -> str:
        return " ".join((self.verb, *self.arguments))

    @property
    def variadic(self) -> bool:
        return bool(self.arguments) and self.arguments[-1].endswith("...")

    def ask(self, predictor: "Predictor", arguments: Sequence[str], **options: Any) -> Prediction:
        """The predictor's answer to this question, ``arguments`` as the command line gave them."""
        fixed = len(self.arguments) - self.variadic
        if len(arguments) < fixed + self.variadic or (not self.variadic and len(arguments) > fixed):
            raise QueryError(f"{predictor.task} {self.verb} takes {' '.join(self.arguments)}; got {len(arguments)} "
                             f"argument{'s' if len(arguments) != 1 else ''}")
        unread = sorted(set(options) - set(self.options))
        if unread:
            raise QueryError(f"{predictor.task} {self.verb} does not read {', '.join(unread)}")
        given = [*arguments[:fixed], list(arguments[fixed:])] if self.variadic else list(arguments)
        answer = self.answer(predictor, *given, **options)
        if self.value is None:
            return answer
        columns = tuple(metavar.lower() for metavar in self.arguments)
        return Prediction((*columns, self.value), ((*arguments, answer),))


class Predictor:
    """A trained run, asked (``cadence.load``): one subclass per task, built by its ``Task.predictor``
    over the run's final rows (read through its ``ParameterView``, a block at a time where a whole table
    could be large: ``block_rows``) and dense module (in evaluation mode: no dropout).

    ``task``: the task's name; ``config``: the run's config; ``kinds``: the kinds of names the run knows
    (``names(kind)``); ``queries``: what ``cadence predict`` may ask it."""

    task: ClassVar[str]
    queries: ClassVar[tuple[Query, ...]] = ()

    def __init__(self, config: Config, names: Sequence[Names]):
        self.config = config
        self.vocabularies = {entry.plural: entry for entry in names}

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(self.vocabularies)

    def names(self, kind: str) -> tuple[str, ...]:
        """The names of the run's ``kind`` (one of ``kinds``), by id."""
        if kind not in self.vocabularies:
            raise QueryError(f"a {self.task} run names {', '.join(self.kinds) or 'nothing'}; not {kind!r}")
        return self.vocabularies[kind].names

    @classmethod
    def query(cls, verb: str) -> Query:
        """The question ``verb`` of this task; a ``QueryError`` listing the task's questions otherwise."""
        for query in cls.queries:
            if query.verb == verb:
                return query
        raise QueryError(f"the {cls.task} task does not answer {verb!r}; it answers: "
                         + "; ".join(query.usage for query in cls.queries))


def check_top(top: int) -> int:
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise QueryError(f"top must be a whole number of answers, at least 1; got {top!r}")
    return top
