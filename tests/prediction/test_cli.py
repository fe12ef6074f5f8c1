"""``cadence predict`` end to end: the answer as a table or a TSV file; a name the run does not know,
a question its task does not answer, a wrong count of arguments or an option the question does not
read is one line, exit 2, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

import cadence
from cadence import api
from cadence.cli import PREDICT_QUESTIONS
from cadence.prediction import Predictor
from cadence.tasks import TASKS
from tests.reliability.harness import Runner

pytestmark = pytest.mark.xdist_group("prediction")

SRC = Path(__file__).resolve().parents[2] / "src"
run_cli = Runner(in_process=True)


def one_line_error(result, *fragments: str) -> str:
    assert result.code == 2, (result.out, result.err)
    assert result.out == ""
    assert result.err.startswith("cadence: error: ") and result.err.count("\n") == 1, result.err
    assert "Traceback" not in result.err
    for fragment in fragments:
        assert fragment in result.err, result.err
    return result.err


def test_an_answer_is_a_table_and_the_same_rows_as_tsv(kge_run: Path, tmp_path: Path) -> None:
    result = run_cli(["predict", str(kge_run), "tails", "e1", "r2", "--top", "3"])
    assert result.code == 0, result.err
    header, rule, *rows = result.out.splitlines()
    assert header.split() == ["tail", "score", "known"] and set(rule) <= {"-", " "} and len(rows) == 3
    expected = cadence.load(kge_run).tails("e1", "r2", top=3)
    assert [row.split()[0] for row in rows] == expected.column("tail")
    assert [row.split()[1] for row in rows] == [f"{score:.4f}" for score in expected.column("score")]
    out = tmp_path / "tails.tsv"
    result = run_cli(["predict", str(kge_run), "tails", "e1", "r2", "--top", "3", "--filter", "--out", str(out)])
    assert result.code == 0 and result.out == f"{out}: 3 rows\n"
    text = out.read_text()
    assert text == cadence.load(kge_run).tails("e1", "r2", top=3, filtered=True).tsv()
    lines = [line.split("\t") for line in text.splitlines()]
    assert lines[0] == ["tail", "score", "known"] and len(lines) == 4 and {line[2] for line in lines[1:]} == {"no"}
    assert [float(line[1]) for line in lines[1:]] == \
        pytest.approx(cadence.load(kge_run).tails("e1", "r2", top=3, filtered=True).column("score"), rel=1e-8)


def test_every_task_answers_through_the_command(w2v_run: Path, mf_run: Path, ctr_run: Path, ctr_data: Path,
                                                image_run: Path, image_data: Path, tmp_path: Path) -> None:
    asked = tmp_path / "clicks.tsv"
    asked.write_text("".join(ctr_data.read_text().splitlines(keepends=True)[:7]))
    for argv, columns, rows in (
            ([str(w2v_run), "similar", "king", "cat", "--negative", "dog", "--top", "4"], ["word", "similarity"], 4),
            ([str(w2v_run), "analogy", "king", "queen", "boy", "--top", "2"], ["word", "similarity"], 2),
            ([str(w2v_run), "similarity", "king", "queen"], ["word1", "word2", "similarity"], 1),
            ([str(mf_run), "items", "u3", "--top", "5"], ["item", "rating", "score"], 5),
            ([str(mf_run), "rating", "u3", "i4"], ["user", "item", "rating"], 1),
            ([str(ctr_run), "clicks", str(asked)], ["line", "probability", "label"], 7),
            ([str(image_run), "classify", str(image_data / "t10k-images-idx3-ubyte.gz")],
             ["image", "class", "probability"], 60)):
        result = run_cli(["predict", *argv])
        assert result.code == 0, (argv, result.err)
        header, _, *lines = result.out.splitlines()
        assert header.split() == columns and len(lines) == rows, argv
    result = run_cli(["predict", str(w2v_run), "similarity", "king", "queen"])
    assert result.out.splitlines()[2].split() == ["king", "queen",
                                                  f"{cadence.load(w2v_run).similarity('king', 'queen'):.4f}"]


@pytest.mark.parametrize("task, argv, fragment", [
    ("kge", ["tails", "nobody", "r2"], "unknown entity 'nobody': not among the run's 30 entities"),
    ("kge", ["heads", "r9", "e1"], "unknown relation 'r9'"),
    ("w2v", ["similar", "king", "--negative", "kingdom"], "unknown word 'kingdom' (did you mean 'king'?)"),
    ("mf", ["items", "u99"], "unknown user 'u99'"),
    ("mf", ["rating", "u1", "x1"], "unknown item 'x1'"),
])
def test_an_unknown_name_is_one_line(task: str, argv: list[str], fragment: str, request) -> None:
    run = request.getfixturevalue(f"{task}_run")
    one_line_error(run_cli(["predict", str(run), *argv]), fragment)


def test_an_unknown_name_in_a_real_process(kge_run: Path) -> None:
    result = Runner(in_process=False, src=SRC)(["predict", str(kge_run), "tails", "e1", "married_to"])
    one_line_error(result, "unknown relation 'married_to'")


@pytest.mark.parametrize("task, verb, supported", [
    ("kge", "similar", "tails HEAD RELATION; heads RELATION TAIL; score FILE"),
    ("w2v", "tails", "similar WORD...; analogy A B C; similarity WORD1 WORD2"),
    ("mf", "similar", "items USER; rating USER ITEM"),
    ("ctr", "rating", "clicks FILE"),
    ("image", "clicks", "classify FILE"),
])
def test_a_question_the_task_does_not_answer_lists_those_it_does(task: str, verb: str, supported: str,
                                                                  request) -> None:
    run = request.getfixturevalue(f"{task}_run")
    one_line_error(run_cli(["predict", str(run), verb, "x"]),
                   f"the {task} task does not answer '{verb}'; it answers: {supported}")


def test_arguments_and_options_a_question_does_not_take(kge_run: Path, w2v_run: Path, tmp_path: Path) -> None:
    one_line_error(run_cli(["predict", str(kge_run), "tails", "e1"]), "kge tails takes HEAD RELATION; got 1 argument")
    one_line_error(run_cli(["predict", str(kge_run), "score", "a", "b"]), "kge score takes FILE; got 2 arguments")
    one_line_error(run_cli(["predict", str(w2v_run), "similar"]), "w2v similar takes WORD...; got 0 arguments")
    one_line_error(run_cli(["predict", str(w2v_run), "analogy", "king", "queen", "boy", "--filter"]),
                   "predict analogy: --filter is not an option of this question (its options: --top")
    one_line_error(run_cli(["predict", str(kge_run), "tails", "e1", "r2", "--top", "0"]), "top must be")
    one_line_error(run_cli(["predict", str(kge_run), "score", str(tmp_path / "missing.txt")]),
                   f"{tmp_path / 'missing.txt'}: file not found")
    one_line_error(run_cli(["predict", str(tmp_path), "tails", "e1", "r2"]), "not a cadence run directory")


def test_an_out_file_that_cannot_be_written_leaves_nothing(kge_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "missing" / "tails.tsv"
    result = run_cli(["predict", str(kge_run), "tails", "e1", "r2", "--out", str(out)])
    assert result.code == 1 and result.err.startswith(f"cadence: error: {out}: cannot write")
    assert not out.parent.exists()


def test_load_is_the_packages() -> None:
    assert cadence.load is api.load and "load" in cadence.__all__


def test_every_task_hands_out_a_predictor_whose_questions_are_its_methods() -> None:
    for name in TASKS.names():
        kind = TASKS.get(name).predictor_type
        assert kind is not None and issubclass(kind, Predictor) and kind.task == name, name
        assert kind.queries, name
        for query in kind.queries:
            assert getattr(kind, query.answer.__name__) is query.answer, (name, query.verb)
            assert kind.query(query.verb) is query


def test_the_commands_help_lists_every_question() -> None:
    listed = {part.split(": ", 1)[0]: part.split(": ", 1)[1].split(", ") for part in PREDICT_QUESTIONS.split("; ")}
    assert listed == {name: [query.usage for query in TASKS.get(name).predictor_type.queries] for name in TASKS.names()}
