"""Property-based tests: random bytes given to every reader, random YAML given to the config loader,
random values given to every flag never end in a traceback. What comes back is a result or a
``CadenceError`` (one line for the user); anything else is a bug.

Each reader also gets lines built from its own format's pieces (fields, tabs, numbers, BOMs,
headers), where the bugs are, not only uniform noise."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import yaml

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from cadence.api import prepare_config  # noqa: E402
from cadence.cli import TRAIN_FLAGS, _training_values, build_parser  # noqa: E402
from cadence.config import Config, flatten, load_config  # noqa: E402
from cadence.strategies.catalog import STRATEGIES  # noqa: E402
from cadence.data.corpus import read_text_corpus  # noqa: E402
from cadence.data.criteo import read_criteo  # noqa: E402
from cadence.data.ratings import read_ratings_file  # noqa: E402
from cadence.data.triples import read_graph_directory  # noqa: E402
from cadence.errors import CadenceError  # noqa: E402

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# pieces of the formats: a line of a reader is a few of these joined by a separator
PIECES = st.sampled_from(["", "0", "1", "-1", "3.5", "1e999", "nan", "inf", "-0", "9" * 30, "68fd1e64", "a", "e1",
                          "r1", "héllo", "\ufeff", "head", "label", "user", "#", " ", "\x00", "\r", "1_0", "+1"])
LINE = st.lists(st.one_of(PIECES, st.text(max_size=6)), max_size=42).flatmap(
    lambda parts: st.sampled_from(["\t", ",", " "]).map(lambda sep: sep.join(parts)))
TEXT = st.one_of(st.binary(max_size=400),
                 st.lists(LINE, max_size=12).map(lambda lines: "\n".join(lines).encode("utf-8", "surrogatepass")),
                 st.lists(LINE, max_size=12).map(lambda lines: b"\xef\xbb\xbf" + "\n".join(lines).encode(
                     "utf-8", "surrogatepass")))


# every example's files live under one folder, removed when the tests end (thousands of examples)
_SCRATCH = tempfile.TemporaryDirectory(prefix="cdn-prop-")


def _file(content: bytes, name: str) -> Path:
    directory = Path(tempfile.mkdtemp(dir=_SCRATCH.name))
    path = directory / name
    path.write_bytes(content)
    return path


def _only_user_errors(read, *args) -> None:
    try:
        read(*args)
    except CadenceError as err:
        assert "\n" not in str(err), f"a message of more than one line: {err!r}"


@SETTINGS
@given(TEXT, TEXT, TEXT)
def test_graph_reader_never_raises_anything_but_a_user_error(train: bytes, valid: bytes, test: bytes) -> None:
    directory = _file(train, "train.txt").parent
    (directory / "valid.txt").write_bytes(valid)
    (directory / "test.txt").write_bytes(test)
    _only_user_errors(read_graph_directory, directory)


@SETTINGS
@given(TEXT)
def test_ratings_reader_never_raises_anything_but_a_user_error(content: bytes) -> None:
    _only_user_errors(read_ratings_file, _file(content, "ratings.tsv"))


@SETTINGS
@given(TEXT, st.integers(0, 3))
def test_criteo_reader_never_raises_anything_but_a_user_error(content: bytes, spare: int) -> None:
    # also lines of exactly 40 columns, where the values are parsed
    _only_user_errors(read_criteo, _file(content, "clicks.tsv"))
    lines = content.decode("utf-8", "replace").splitlines() or [""]
    forty = "\n".join("\t".join((line.split("\t") + [""] * 40)[:40]) for line in lines)
    _only_user_errors(read_criteo, _file(forty.encode(), "clicks.tsv"))


@SETTINGS
@given(TEXT, st.integers(1, 3))
def test_corpus_reader_never_raises_anything_but_a_user_error(content: bytes, min_count: int) -> None:
    _only_user_errors(read_text_corpus, _file(content, "corpus.txt"), min_count)


YAML_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=8)),
    lambda children: st.one_of(st.lists(children, max_size=3),
                               st.dictionaries(st.sampled_from(["model", "dim", "lr", "train", "epochs", "optimizer",
                                                                "strategy", "ps", "workers", "x", "seed", "task"]),
                                               children, max_size=4)),
    max_leaves=12)


@SETTINGS
@given(st.one_of(YAML_VALUES.map(lambda value: yaml.safe_dump(value)), st.text(max_size=200)))
@example("\x1f")  # found by this test: a control character (yaml's ReaderError has no line mark)
@example("a: 1\na: 2\n")
def test_config_loader_never_raises_anything_but_a_user_error(text: str) -> None:
    path = _file(text.encode("utf-8", "surrogatepass"), "config.yaml")
    _only_user_errors(lambda: prepare_config(load_config(path)))


FLAG_VALUE = st.one_of(st.text(max_size=12), PIECES, st.integers().map(str),
                       st.floats(allow_nan=True, allow_infinity=True).map(repr))
KEYS = ["model.dim", "optimizer.lr", "train.epochs", "strategy", "ps.workers", "task", "seed", "eval.every",
        "data", "model", "nope.key", "ps.stragglers", "ctr.hidden", "w2v.window", "pipeline.stall_timeout"]


@SETTINGS
@given(st.lists(st.tuples(st.sampled_from(sorted(TRAIN_FLAGS)), FLAG_VALUE), max_size=4),
       st.lists(st.tuples(st.sampled_from(KEYS), FLAG_VALUE), max_size=3))
@example([("--engine", "\n")], [])  # found by this test: a message of two lines
@example([], [("model.dim", "99999999999999999999999")])
def test_flag_parser_never_raises_anything_but_a_user_error(flags, sets) -> None:
    argv = ["train"]
    for flag, value in flags:
        argv.append(f"{flag}={value}")
    for key, value in sets:
        argv += ["--set", f"{key}={value}"]
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:  # argparse's one-line error (a mistyped int or float)
        assert exit_.code == 2
        return
    _only_user_errors(lambda: prepare_config(load_config(args.config, values=_training_values(args))))


# every key of every section (issue 29: the sections added since, shadow, pdasgd, adapm, image, auto, ...)
ALL_KEYS = sorted(flatten(Config().to_dict()))
EDGE_VALUE = st.one_of(FLAG_VALUE, st.sampled_from(["0", "-1", "1e300", "1e-300", "1e18", "4294967296", "true",
                                                    "[]", "[0]", "[1000000000]", "null", "''", "{}"]))
STRATEGY_NAMES = sorted(STRATEGIES.names())


@settings(max_examples=400, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(ALL_KEYS), EDGE_VALUE), min_size=1, max_size=4),
       st.sampled_from(STRATEGY_NAMES), st.sampled_from(["kge", "ctr", "mf", "w2v", "image"]))
@example([("adapm.initial_rate", "1e300")], "adapm", "kge")
@example([("shadow.max_syncs_per_second", "1e-300")], "shadow-ma", "kge")
@example([("threads", "1000000000")], "sync", "kge")
def test_any_value_of_any_key_under_any_strategy_is_a_user_error_or_accepted(sets, strategy, task) -> None:
    """Random values for keys of every section, with every strategy and task: ``prepare_config`` (every
    check a run makes before it reads data) accepts them or raises one line, within 2 s (a check whose
    cost grows with a setting would hang here)."""
    values = [("strategy", strategy, "--strategy"), ("task", task, "--task")]
    for key, value in sets:
        values.append((key, _yaml_value(value), f"--set {key}"))
    _only_user_errors(lambda: prepare_config(load_config(None, values=values)))


def _yaml_value(text: str):
    try:
        return yaml.safe_load(text) if text.strip() else text
    except yaml.YAMLError:
        return text


SECTION_OF = {"adapm": "adapm", "pdasgd": "pdasgd", "pdasgd-bu": "pdasgd", "hogwild": "shadow",
              **{f"{kind}-{rule}": "shadow" for kind in ("shadow", "fr") for rule in ("easgd", "ma", "bmuf")},
              "async": "pipeline", "oac": "pipeline", "gba": "ps", "bsp": "ps", "hop_bs": "ps", "hop_bw": "ps"}
RUN_LIMIT = 90.0  # seconds a tiny run may take, whatever its settings: past it, a hang
# the section of each task's own settings (kge's model: its scorer's options and dim)
TASK_SECTION = {"kge": "model", "ctr": "ctr", "mf": "mf", "w2v": "w2v", "image": "image"}
# keys whose job is to make a run longer or larger (its epochs, its data's size): a large value is a
# long run, not a hang or a mistake
SIZE_KEYS = ("train.epochs", ".synthetic.", "image.valid_size")


def _tiny_run(task: str, strategy: str, sets: list[tuple[str, str]]) -> None:
    """A real run (its own process: a hang is killed at ``RUN_LIMIT``) of tiny data of ``task`` under
    ``strategy`` with ``sets``: it trains, or stops with one ``cadence: error:`` line; never a
    traceback, never a hang."""
    import subprocess

    from tests.reliability.harness import BASE, TASK_ARGS, Runner, write_data

    workdir = Path(tempfile.mkdtemp(dir=_SCRATCH.name))
    argv = ["-q", "train", *BASE, *TASK_ARGS[task], *write_data(workdir / "data", task), "--strategy", strategy,
            "--out", str(workdir / "run"), *(["--workers", "2"] if SECTION_OF[strategy] in ("shadow", "ps", "adapm") else [])]
    for key, value in sets:
        argv += ["--set", f"{key}={value}"]
    runner = Runner(in_process=False)
    try:
        done = subprocess.run(runner.command(argv), capture_output=True, text=True, env=runner.env(),
                              timeout=RUN_LIMIT)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"a hang: {' '.join(argv)}") from None
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert lines and lines[-1].startswith("cadence: error:"), done.stderr[-3000:]


DEFAULTS = flatten(Config().to_dict())
# values of each key's own type, at and past the edges (most reach the run, past the type checks)
TYPED = {bool: st.sampled_from(["true", "false"]),
         int: st.sampled_from(["0", "1", "2", "3", "-1", "64", "1000000", "1000000000", "4294967296"]),
         float: st.sampled_from(["0", "0.5", "1", "-1", "1e-6", "1e-300", "100", "1e300"]),
         list: st.sampled_from(["[]", "[0]", "[1]", "[8, 8]", "[1000000000]"])}


def _value_for(key: str):
    typed = TYPED.get(type(DEFAULTS[key]))
    edge = EDGE_VALUE.filter(lambda text: "\x00" not in text)  # (no process takes a NUL in its arguments)
    return edge if typed is None else st.one_of(typed, typed, typed, edge)


@st.composite
def _run_settings(draw) -> tuple[str, str, list[tuple[str, str]]]:
    """(task, strategy, values for keys of the task's section and the strategy's: mostly of each
    key's own type, at and past its edges)."""
    task = draw(st.sampled_from(sorted(TASK_SECTION)))
    strategy = draw(st.sampled_from(sorted(SECTION_OF)))
    sections = (TASK_SECTION[task] + ".", SECTION_OF[strategy] + ".")
    keys = [key for key in ALL_KEYS if key.startswith(sections) and not any(part in key for part in SIZE_KEYS)]
    chosen = draw(st.lists(st.sampled_from(keys), min_size=1, max_size=3, unique=True))
    return task, strategy, [(key, draw(_value_for(key))) for key in chosen]


@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(_run_settings())
def test_random_values_of_a_task_s_and_a_strategy_s_keys_train_or_are_one_line(drawn) -> None:
    """Issue 50's run-level property, a few fixed examples (derandomized: the same ones on every
    machine): random values for keys of the chosen task's section and the chosen strategy's, a real
    tiny run each, bounded in time; every outcome a run or a one-line refusal."""
    _tiny_run(*drawn)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_run_settings())
def test_any_value_of_a_task_s_and_a_strategy_s_keys_trains_or_is_one_line_in_bounded_time(drawn) -> None:
    """The property above over fresh random examples each time (``make test-slow``)."""
    _tiny_run(*drawn)
