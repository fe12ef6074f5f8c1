"""The ``cadence`` command: a thin layer over ``cadence.api``.

    cadence data list | data fetch NAME...
    cadence train [--config FILE] [--set key=value]... [--dataset ...] [--resume RUN_DIR]
    cadence compare --strategies sync,async,oac [train options] --out DIR
    cadence eval RUN_DIR [--split test]
    cadence export RUN_DIR --format npy|tsv|word2vec --out DIR
    cadence predict RUN_DIR QUERY ARG... [--top K] [--filter] [--negative WORD] [--out FILE]

A user's mistake (``CadenceError``) prints one line, ``cadence: error: ...``, and exits with 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from typing import Any, Callable, Sequence

from cadence import auto
from cadence.comparison import Against, cell, metrics_of
from cadence.config import Config
from cadence.errors import CadenceError, ConfigError, SystemResourceError, describe_os_error

def path_arg(text: str) -> str:
    """A path on the command line: an empty one (``--out ""``) would mean the working directory
    without saying so, and is refused."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path")
    return text


# flags for the common keys: flag -> (dotted config key, type)
TRAIN_FLAGS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "--dataset": ("data.dataset", str),
    "--model": ("model.name", str),
    "--dim": ("model.dim", int),
    "--epochs": ("train.epochs", int),
    "--batch-size": ("train.batch_size", int),
    "--lr": ("optimizer.lr", float),
    "--strategy": ("strategy", str),
    "--seed": ("seed", int),
    "--out": ("out", path_arg),
    "--task": ("task", str),
    "--workers": ("ps.workers", int),
    "--engine": ("ps.engine", str),
    "--init-from": ("train.init_from", path_arg),
    "--device": ("device", str),
}


class _Parser(argparse.ArgumentParser):
    """A mistyped command line is one line, like every other mistake (argparse prints its usage)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"cadence: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="cadence", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=_version())
    parser.add_argument("-q", "--quiet", action="store_true", help="print warnings and errors only")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    data = commands.add_parser("data", help="list and fetch datasets")
    data_commands = data.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    data_commands.add_parser("list", help="list registered datasets")
    fetch = data_commands.add_parser("fetch", help="download datasets into $CADENCE_HOME")
    fetch.add_argument("names", nargs="+", metavar="NAME")

    train = commands.add_parser("train", help="train a model")
    _add_training_options(train)
    train.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its newest checkpoint")
    train.add_argument("--record-order", metavar="FILE", help="write the computation order of the batches")
    train.add_argument("--batch-order", metavar="FILE", help="replay a recorded computation order")

    compare = commands.add_parser("compare", help="train one config under several strategies, side by side")
    compare.add_argument("--strategies", required=True, metavar="A,B,...",
                         help="comma-separated strategy names, e.g. sync,async,oac")
    compare.add_argument("--repeats", type=int, default=1, metavar="N",
                         help="train each strategy N times, interleaved (A B C A B C ...); each cell is the median "
                              "with its range, and a speed-up whose ranges overlap the first strategy's shows as ≈")
    compare.add_argument("--no-warm-up", dest="warm_up", action="store_false",
                         help="time each strategy's first run from its first batch (by default a few batches on a "
                              "scratch copy pay the one-time costs, compiling kernels, first touch, untimed)")
    _add_training_options(compare)

    evaluate = commands.add_parser("eval", help="evaluate a run's final model")
    evaluate.add_argument("run_dir", metavar="RUN_DIR", type=path_arg)
    evaluate.add_argument("--split", default="test", choices=["train", "valid", "test"])

    export = commands.add_parser("export", help="export embeddings and id maps")
    export.add_argument("run_dir", metavar="RUN_DIR", type=path_arg)
    export.add_argument("--format", default="npy", choices=["npy", "tsv", "word2vec"],
                        help="npy (every task); tsv: a name, then its vector, per line (every task); word2vec: the "
                             "text format gensim's KeyedVectors reads (task w2v)")
    export.add_argument("--out", required=True, metavar="DIR", type=path_arg)

    predict = commands.add_parser("predict", help="ask a run's final model: top answers by name, scores, classes",
                                  description=f"Ask a run's final model (docs/predict.md). {PREDICT_QUESTIONS}.")
    predict.add_argument("run_dir", metavar="RUN_DIR", type=path_arg)
    predict.add_argument("query", metavar="QUERY", help="the question, e.g. tails (a question the run's task does "
                                                        "not answer lists those it does)")
    predict.add_argument("arguments", nargs="*", metavar="ARG", help="the question's arguments: names as the run's "
                                                                      "data spells them, or a file")
    for flag, (option, settings) in PREDICT_OPTIONS.items():  # (an option not given is not in ``args``)
        predict.add_argument(flag, dest=option, default=argparse.SUPPRESS, **settings)
    predict.add_argument("--out", metavar="FILE", type=path_arg, help="write the answer to FILE as TSV (a line of column names, "
                                                       "then a line per row), whole or not at all")

    report = commands.add_parser("report", help="one self-contained HTML page of runs and comparisons")
    report.add_argument("paths", nargs="+", metavar="RUN_OR_COMPARISON_DIR", type=path_arg)
    report.add_argument("--out", required=True, metavar="FILE", type=path_arg, help="the HTML file to write, e.g. report.html")
    report.add_argument("--title", help="the page's title")
    return parser


def _add_training_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", type=path_arg, help="YAML config file")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key (dotted), repeatable")
    for flag, (key, kind) in TRAIN_FLAGS.items():
        metavar = "PATH" if kind is path_arg else kind.__name__.upper()
        parser.add_argument(flag, type=kind, metavar=metavar, help=f"sets {key}")
    parser.add_argument("--strict", action="store_true", help="error on unseen ids and duplicates")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    parser.add_argument("--overwrite", action="store_true", help="replace the run(s) in --out")
    parser.add_argument("--straggler", action="append", default=[], metavar="WORKER:SLOWDOWN[@FIRST-LAST]",
                        help="fault injection (parameter server): make a worker this many times slower (between "
                             "its pull and its push, so its gradients go stale), in epochs FIRST..LAST only if "
                             "given; repeatable")
    parser.add_argument("--kill-worker", action="append", default=[], metavar="WORKER:AFTER_STEPS",
                        help="fault injection (parameter server): kill a worker after this many batches; repeatable")


def _training_values(args: argparse.Namespace) -> list[tuple[str, Any, str]]:
    """(config key, value, what the user typed) of the training options: ``--set`` items read as
    YAML, in order; then every flag as the value argparse typed (never re-read as YAML), named
    in messages as the user typed it."""
    from cadence.config import parse_override

    values = [(*parse_override(item), f"--set {_shown(item)}") for item in args.set]
    for flag, (key, _) in TRAIN_FLAGS.items():
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value is not None:
            values.append((key, value, f"{flag} {_shown(str(value))}"))
    if args.strict:
        values.append(("data.strict", True, "--strict"))
    if args.no_progress:
        values.append(("progress", False, "--no-progress"))
    for option, key in (("straggler", "ps.stragglers"), ("kill_worker", "ps.kill_workers")):
        if getattr(args, option):
            flag = "--" + option.replace("_", "-")
            values.append((key, list(getattr(args, option)), " ".join(f"{flag} {v}" for v in getattr(args, option))))
    for option, key in (("record_order", "record_order"), ("batch_order", "batch_order")):
        if getattr(args, option, None):
            values.append((key, getattr(args, option), f"--{option.replace('_', '-')} {getattr(args, option)}"))
    return values


def _one_line(message: str) -> str:
    return message.replace("\r", "\\r").replace("\n", "\\n")


def _shown(text: str) -> str:
    """A value as the user typed it, quoted when it holds spaces or control characters (a message
    stays one line)."""
    return text if text and text.isprintable() and " " not in text else repr(text)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _configure_logging(args.quiet)
    try:
        return COMMANDS[args.command](args)
    except CadenceError as err:
        print(f"cadence: error: {_one_line(str(err))}", file=sys.stderr)
        return err.exit_code
    except OSError as err:  # the operating system refused something no check above foresaw
        print(f"cadence: error: {_one_line(describe_os_error(err))}", file=sys.stderr)
        return SystemResourceError.exit_code
    except Terminated:
        print("cadence: terminated (SIGTERM); --resume continues the run from its newest checkpoint", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("cadence: interrupted", file=sys.stderr)
        return 130


def _data(args: argparse.Namespace) -> int:
    from cadence.data.registries import dataset_registries

    registries = dataset_registries()
    if args.data_command == "list":
        rows = []
        for task, registry in registries.items():
            for name in registry:
                dataset = registry.get(name)
                fetched_from = dataset.source or getattr(dataset, "build", None)
                status = "generated" if fetched_from is None else ("yes" if dataset.is_fetched() else "no")
                rows.append((name, task, status, dataset.description))
        _print_table(["dataset", "task", "fetched", "description"], rows)
        return 0
    known = sorted({name for registry in registries.values() for name in registry})
    unknown = [name for name in args.names if name not in known]
    if unknown:
        raise ConfigError(f"data fetch: unknown dataset {', '.join(map(repr, unknown))}; "
                          f"choose from: {', '.join(known)}")
    for name in args.names:
        owner = next(registry for registry in registries.values() if name in registry)
        directory = owner.get(name).fetch()
        print(f"{name}: {directory}" if directory else f"{name}: generated on demand, nothing to fetch")
    return 0


def _train(args: argparse.Namespace) -> int:
    from cadence.config import load_config

    values = _training_values(args)
    config, measured = None, None
    if not args.resume:
        config = load_config(args.config, values=values)
        if config.strategy == auto.AUTO and config.auto.isolate:
            # every trial in a process of its own, before this one imports the training code (torch)
            # or reads the data: a memory cap holds this process and a trial's together (docs/auto.md)
            auto.check_unread(config)
            measured = auto.choose_in_processes(config, candidate_trial, candidate_names)[1]
    from cadence import api  # (after the trials)

    if args.resume:
        if args.config:
            raise CadenceError("--resume continues a run with its own config.yaml; drop --config")
        if args.overwrite:
            raise CadenceError("--resume continues a run and --overwrite replaces one; give one of them")
        result = api.resume(args.resume, {key: value for key, value, _ in values},
                            origins={key: origin for key, _, origin in values})
    else:
        result = api.train(config, overwrite=args.overwrite, measured=measured)
    _print_summary(result.summary)
    print(f"run directory: {result.run_dir}")
    return 0


def candidate_names(config: Config) -> list[str]:
    """``api.candidates``, in a process of its own (the strategies' code is imported there)."""
    from cadence import api

    return api.candidates(config)


def candidate_trial(config: Config, name: str) -> auto.Trial:
    """``api.candidate_trial``, in a trial's own process (the training code is imported there)."""
    from cadence import api

    return api.candidate_trial(config, name)


def _compare(args: argparse.Namespace) -> int:
    from cadence import api
    from cadence.config import load_config

    config = load_config(args.config, values=_training_values(args))
    if config.out is None:
        raise CadenceError("compare needs --out DIR for its runs, comparison.json and plots")
    strategies = [name.strip() for name in args.strategies.split(",") if name.strip()]
    comparison = api.compare(config, strategies, config.out, overwrite=args.overwrite, repeats=args.repeats,
                             warm=args.warm_up)
    print_comparison(comparison)
    if comparison.get("plots"):
        print(f"comparison: {config.out}/comparison.json, {', '.join(comparison['plots'])}")
    else:
        print(f"comparison: {config.out}/comparison.json (no plots: matplotlib is not installed; "
              "pip install 'cadence[plot]')")
    return 0


COUNTERS = ("stale_reads", "lost_updates", "repaired_rows", "skipped_writes", "peak_cache_rows", "evicted_rows",
            "global_steps", "gradients_dropped", "staleness_mean", "staleness_max", "sync_gap", "syncs_per_second",
            "examples_in_flight", "eval_candidates")


def print_comparison(comparison: dict[str, Any]) -> None:
    """The table (each cell the median of a strategy's runs, with their range over several), then
    the sentence made from the same numbers (``comparison.verdict``)."""
    entries = comparison["strategies"]
    summaries = [entry["summary"] for entry in entries.values()]
    table = comparison.get("stats") or {}
    baseline = summaries[0]["examples_per_second"] or 1.0
    primary = summaries[0].get("primary_metric", "mrr")
    metrics = metrics_of(primary)
    stat_keys = [k for k in COUNTERS if any(k in summary for summary in summaries)]
    header = ["strategy", "runtime", "epochs", "train_seconds", "examples/s", "speedup", *metrics, *stat_keys]
    rows = []
    for name, summary in zip(entries, summaries):
        spread = table.get(name, {})
        speedup = spread.get("speedup")
        rows.append([name, summary.get("runtime", "-"), summary["epochs"],
                     cell(spread["train_seconds"], ".2f") if "train_seconds" in spread else f"{summary['train_seconds']:.2f}",
                     cell(spread["examples_per_second"], ",.0f") if "examples_per_second" in spread
                     else f"{summary['examples_per_second']:,.0f}",
                     Against(**speedup).cell if speedup else f"{summary['examples_per_second'] / baseline:.2f}x",
                     *(cell(spread[k], ".4f") if k in spread else _format(summary.get(k, float("nan"))) for k in metrics),
                     *(_format(summary[k]) if k in summary else "-" for k in stat_keys)])
    _print_table(header, rows)
    _note_sampled_ranking(summaries)
    if comparison.get("verdict"):
        repeats = comparison.get("repeats", 1)
        warmed = [s["warmup_seconds"] for s in summaries if "warmup_seconds" in s]
        print(f"{repeats} run{'s' if repeats > 1 else ''} each, interleaved"
              + (f"; each strategy's one-time costs paid before its timed runs ({min(warmed):.1f}-"
                 f"{max(warmed):.1f} s, untimed)" if warmed else "") + f". {comparison['verdict']}")


def _note_sampled_ranking(summaries: Sequence[dict[str, Any]]) -> None:
    """A line under a table whose ranks were taken against sampled entities (``eval.negatives``)."""
    sampled = sorted({int(summary["eval_candidates"]) for summary in summaries if "eval_candidates" in summary})
    if sampled:
        print(f"mrr and hits@k: each query ranked against {' or '.join(map(str, sampled))} sampled entities "
              "(eval.negatives), not every entity: not comparable with exact ranking")


def _eval(args: argparse.Namespace) -> int:
    from cadence import api

    metrics = api.evaluate(args.run_dir, args.split)
    _print_table(["split", *metrics], [[args.split, *(f"{v:.4f}" if isinstance(v, float) else str(v)
                                                      for v in metrics.values())]])
    _note_sampled_ranking([metrics])
    return 0


def _export(args: argparse.Namespace) -> int:
    from cadence import api

    for path in api.export(args.run_dir, args.out, args.format):
        print(path)
    return 0


def _predict(args: argparse.Namespace) -> int:
    from cadence import api

    query = api.predictor_type(args.run_dir).query(args.query)
    options = {option: getattr(args, option) for option, _ in PREDICT_OPTIONS.values() if hasattr(args, option)}
    unread = [flag for flag, (option, _) in PREDICT_OPTIONS.items()
              if option in options and option not in query.options]
    if unread:
        reads = [flag for flag, (option, _) in PREDICT_OPTIONS.items() if option in query.options]
        raise CadenceError(f"predict {query.verb}: {', '.join(unread)} is not an option of this question "
                           f"({'its options: ' + ', '.join(reads) if reads else 'it has none'}; usage: {query.usage})")
    answer = api.predict(args.run_dir, args.query, args.arguments, args.out, **options)
    if args.out:
        print(f"{args.out}: {len(answer):,} row{'s' if len(answer) != 1 else ''}")
    else:
        _print_table(answer.columns, [[_cell(value) for value in row] for row in answer])
    return 0


# every task's questions, for ``cadence predict --help`` (without importing the tasks: a test keeps it whole)
PREDICT_QUESTIONS = ("kge: tails HEAD RELATION, heads RELATION TAIL, score FILE; w2v: similar WORD..., analogy A B C, "
                     "similarity WORD1 WORD2; mf: items USER, rating USER ITEM; ctr: clicks FILE; image: classify FILE")
# ``cadence predict``'s options: flag -> (the keyword of the predictor's methods, argparse settings)
PREDICT_OPTIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "--top": ("top", {"type": int, "metavar": "K", "help": "how many answers to list, best first (default 10)"}),
    "--filter": ("filtered", {"action": "store_true", "help": "kge tails, heads: leave out known triples (train, "
                                                             "valid and test, as filtered evaluation does); kept "
                                                             "and marked in the column 'known' by default"}),
    "--negative": ("negative", {"action": "append", "metavar": "WORD",
                                "help": "w2v similar: a word to move away from (gensim's negative); repeatable"}),
}


def _cell(value: Any) -> str:
    """A value of an answer, as the table shows it."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4f}"
    return _one_line(str(value))


def _report(args: argparse.Namespace) -> int:
    from cadence.report.html import write_report

    print(write_report(args.paths, args.out, args.title))
    return 0


COMMANDS = {"data": _data, "train": _train, "compare": _compare, "eval": _eval, "export": _export,
            "predict": _predict, "report": _report}


def _print_summary(summary: dict[str, Any]) -> None:
    keys = ["task", "strategy", "runtime", "dataset", "model", "epochs", "train_seconds", "examples_per_second",
            "mrr", "hits@1", "hits@3", "hits@10", "eval_candidates", "auc", "logloss", "ne", "rmse", "mae", "wordsim353",
            "simlex999", "analogy", "accuracy", "cross_entropy", "global_steps", "gradients_dropped", "staleness_mean", "staleness_max",
            "sync_gap", "syncs_per_second", "examples_in_flight"]
    if "sync_gap" in summary:  # ShadowSync: every gradient applied on arrival, none stale by a step count
        keys = [k for k in keys if k not in ("global_steps", "gradients_dropped", "staleness_mean", "staleness_max")]
    shown = [k for k in keys if k in summary]
    _print_table(shown, [[_format(summary[k]) for k in shown]])
    _note_sampled_ranking([summary])


def _format(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if value >= 1000 else f"{value:.4f}"
    return str(value)


def _print_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    table = [list(map(str, header))] + [list(map(str, row)) for row in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for index, row in enumerate(table):
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
        if index == 0:
            print("  ".join("-" * width for width in widths))


class _TqdmHandler(logging.Handler):
    """Log lines that do not tear through progress bars."""

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm.auto import tqdm

        tqdm.write(self.format(record), file=sys.stderr)


def _configure_logging(quiet: bool) -> None:
    logger = logging.getLogger("cadence")
    if not logger.handlers:
        handler = _TqdmHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.WARNING if quiet else logging.INFO)
    logger.propagate = False


def _version() -> str:
    from cadence import __version__

    return f"cadence {__version__}"


def entry() -> None:
    """The ``cadence`` command. After Ctrl-C it exits at once with 130, without the interpreter's
    teardown: worker threads may be inside torch kernels, and tearing the runtime down under them
    aborts the process. Nothing is lost: every file a run writes is written whole or not at all,
    and ``--resume`` continues from the newest checkpoint."""
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    code = main()
    if code in (130, 143) or (code and _stage_threads_alive()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def _interrupt(signum: int, frame: Any) -> None:
    """Ctrl-C (``KeyboardInterrupt``) and SIGTERM (``Terminated``), except inside a callback the
    interpreter runs for the import system (a module lock's weakref callback), where it would be
    printed and dropped: there the signal is sent again a moment later, once that callback has returned."""
    if frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
        threading.Timer(0.01, os.kill, (os.getpid(), signum)).start()
        return
    raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, a scheduler ending a job): a Ctrl-C of its own exit code, 143."""


def _stage_threads_alive() -> bool:
    """Whether a pipeline stage thread outlived a failed run (one stuck in a stage when the
    watchdog stopped it): the interpreter's teardown would abort under it (exit 134)."""
    return any(thread.name.startswith("cadence-") and thread.is_alive() for thread in threading.enumerate())


if __name__ == "__main__":
    entry()
