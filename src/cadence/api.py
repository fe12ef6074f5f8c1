"""The Python API; the CLI is a thin layer over these functions.

    result = cadence.train(cadence.load_config("configs/umls-complex.yaml"))
    result.summary["mrr"]

``train`` validates everything it can (config, registry names, keys of other tasks, data) before it
creates the run directory, so a user's mistake leaves no partial output behind. Every task runs
under every strategy; the runtime follows from the strategy and ``ps.workers``
(``cadence.strategies.STRATEGIES``: each entry picks and builds its runtime).
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import torch

from cadence.config import AutoConfig, Config, flatten, load_config, user_terms
from cadence.data import fingerprint
from cadence.device import resolve_device, use_deterministic_kernels
from cadence.engines.threads import usable_cores
from cadence.errors import (CadenceError, CheckpointError, ConfigError, ProcessLost, QueryError, lost_process,
                            os_errors)
from cadence.models.image import IMAGE_MODELS
from cadence.optim import DENSE_READS, ENTITY_OPTIMIZERS, schedule_reads
from cadence.prediction import Prediction, Predictor
from cadence.core.strategy import BuildContext, RuntimeKind, Strategy
from cadence.strategies.catalog import STRATEGIES, runtime_kinds
from cadence.tasks import TASKS, Task
from cadence.core import checkpoint as ckpt
from cadence.training.batch_order import BatchOrder
from cadence.training.run_directory import RunDirectory, default_run_dir, finite, write_atomic  # noqa: F401  (re-exported)
from cadence.core.keys import KeyIndex
from cadence.core.runtime import RowsView, Runtime
from cadence import auto, comparison as stats
from cadence.training import grow
from cadence.training.environment import environment
from cadence.training.trainer import Trainer, TrainerHook

log = logging.getLogger("cadence")

RESUMABLE_KEYS = {"train.epochs", "progress", "threads", "adapt_threads", "device"}
DEFAULT_MODELS = {"kge": "complex", "ctr": "deepfm", "mf": "biased", "w2v": "skipgram", "image": "mlp"}
WARM_UP_BATCHES = 8  # compare: batches of a scratch run that pay a process's one-time costs before timing
DEFAULT_ENTITY_OPTIMIZERS = {"kge": "rowwise_adagrad", "ctr": "rowwise_adagrad", "mf": "adagrad", "w2v": "sgd",
                             "image": "sgd"}  # (image: no rows; sgd keeps no per-row state)


@dataclass
class TrainResult:
    run_dir: Path
    summary: dict[str, Any]
    metrics: list[dict[str, Any]]


def train(config: Config, overwrite: bool = False, hooks: Iterable[TrainerHook] = (),
          measured: dict[str, Any] | None = None, warm_up: int = 0) -> TrainResult:
    """Train from scratch into ``config.out`` (default: ``runs/<dataset>-<model>-<strategy>-<time>``).
    ``measured``: with ``strategy: auto``, the choice its trials already made (``auto.choose_in_processes``
    with ``candidate_trial``, as the CLI does before it imports this module); else they run here.
    ``warm_up``: first train that many batches on a scratch runtime, discarded (``warm_up``), so the
    process's one-time costs fall outside ``train_seconds``; summary.json's ``warmup_seconds`` says what
    they took."""
    with user_terms(config):
        return _train(config, overwrite, hooks, measured, warm_up)


def _train(config: Config, overwrite: bool, hooks: Iterable[TrainerHook], measured: dict[str, Any] | None,
           batches: int = 0) -> TrainResult:
    auto.check_unread(config)
    if config.strategy == auto.AUTO:  # (one algorithm for every candidate, said once)
        config = copy.deepcopy(config)
        resolve_update(config, [auto.AUTO])
    chosen = None
    if config.strategy == auto.AUTO and measured is not None:
        chosen = measured
        config = prepare_config(for_contender(config, measured["chosen"], candidates(config)))
        task = TASKS.get(config.task)(config)
    elif config.strategy == auto.AUTO:  # measured here, once: every layer below sees a strategy
        config, chosen, task = _choose_strategy(config)
    else:
        config = prepare_config(config)
        task = TASKS.get(config.task)(config)
    task.check_splits(_measured_splits(config))  # (an empty one: before anything is written)
    original = task
    task, init = _init_checkpoint(config, task)  # a model that does not fit fails here, before anything is written
    if config.batch_order:
        order = BatchOrder.load(config.batch_order)
        order.check(lambda epoch: len(task.plan(epoch)), task.num_epochs())
    if config.out is None:
        config.out = default_run_dir(task.dataset_name, config.model.name, config.strategy)
    _connect(config)  # an unreachable cluster fails here, before a run directory exists
    run = RunDirectory(config.out)
    with run.locked():  # one writer per run directory; checked under the lock: no other run slips in
        run.check_empty(overwrite)
        warmed = warm_up(config, task, batches) if batches else None
        trainer = build_trainer(config, task, run, hooks)
        trainer.notes["environment"] = environment()
        if warmed is not None:
            trainer.notes["warmup_seconds"] = round(warmed, 4)
        if chosen is not None:
            trainer.notes["auto"] = chosen
        try:
            if init is not None:
                trainer.init_from(config.train.init_from, *init)
            run.create(config, overwrite=overwrite)  # an old run (--overwrite) goes only now
            task.write_metadata(run.path)
            grow.write_vocabulary(run.path, task.vocabulary())
            if init is not None:
                init[2].save(run.path)
                if task is not original:
                    grow.save_kept(run.path, original, task)
            if chosen is not None:
                auto.save(run.path, chosen)
        except BaseException:
            trainer.runtime.close()
            raise
        return _fit(trainer, run)


def resume(run_dir: str | Path, overrides: dict[str, Any] | None = None,
           hooks: Iterable[TrainerHook] = (), origins: dict[str, str] | None = None) -> TrainResult:
    """Continue the run in ``run_dir`` from its newest valid checkpoint. ``overrides``: keys of
    ``RESUMABLE_KEYS`` to change; ``origins``: how the user gave each (a flag, for messages)."""
    run = RunDirectory(run_dir)
    config = run.load_config()
    if overrides:
        origins = origins or {}
        unsupported = [origins.get(key, key) for key in sorted(set(overrides) - RESUMABLE_KEYS)]
        if unsupported:
            raise ConfigError(f"--resume uses the run's config.yaml; {', '.join(unsupported)}: cannot be "
                              f"changed (only {', '.join(sorted(RESUMABLE_KEYS))}: --epochs, --device, --no-progress, "
                              "--set threads=N)")
        given = [(key, value, f"{origins.get(key, key)} (given with --resume)") for key, value in overrides.items()]
        config = load_config(run.config_path, values=given)
    with user_terms(config):
        return _resume(config, run, overrides, hooks)


def _resume(config: Config, run: RunDirectory, overrides: dict[str, Any] | None,
            hooks: Iterable[TrainerHook]) -> TrainResult:
    config = prepare_config(config)
    task = grow.restore_kept(run.path, TASKS.get(config.task)(config))
    grown, task.frozen = grow.load_growth(run.path)  # a grown run freezes the same rows again
    chosen = auto.load(run.path)
    _connect(config)
    with run.locked():  # one writer per run directory
        trainer = build_trainer(config, task, run, hooks)
        trainer.notes.update({key: note for key, note in (("init_from", grown), ("auto", chosen)) if note})
        trainer.notes["environment"] = environment()  # (this process's: a resume may run elsewhere)
        try:
            if not trainer.resume():
                log.warning("%s has no checkpoint yet: training from the start", run.path)
        except BaseException:
            trainer.runtime.close()
            raise
        if overrides:
            write_atomic(run.config_path, config.to_yaml())
        return _fit(trainer, run)


def compare(config: Config, strategies: list[str], out: str | Path, overwrite: bool = False, repeats: int = 1,
            warm: bool = True) -> dict[str, Any]:
    """Train the same config (seed, data, hyperparameters) under each strategy, side by side,
    ``repeats`` times, interleaved (A B C A B C ...): a slow minute of a shared machine falls on every
    contender alike. ``warm``: before its first timed run, each contender trains a few batches on a
    scratch runtime, discarded, so one-time costs (compiling kernels, first touch of caches and thread
    pools) are paid outside every ``train_seconds`` (each summary's ``warmup_seconds``).

    Writes the first round's run directories at ``out/<strategy>/`` and round k's at
    ``out/repeats/<k>/<strategy>/``, ``out/comparison.json`` (each strategy's first summary and
    validation curve, every run's summary, ``stats``: each contender's median and range of its speed and
    metrics, its speed against the first contender's, and ``verdict``: the sentence the table says),
    and, when matplotlib is installed, ``out/time_to_accuracy.png`` and ``out/accuracy_per_epoch.png``.
    """
    if not strategies:
        raise ConfigError("compare needs at least one strategy")
    if len(set(strategies)) != len(strategies):
        raise ConfigError(f"a strategy is listed twice: {','.join(strategies)}")
    if repeats < 1:
        raise ConfigError(f"--repeats {repeats}: at least 1 (each contender trained that many times, interleaved)")
    if repeats > 1 and (config.record_order or config.batch_order):
        raise ConfigError(f"--repeats {repeats} with {'record_order' if config.record_order else 'batch_order'}: "
                          "each repeat would record or replay the same file; compare one run (--repeats 1)")
    for name in strategies:  # every one is checked before the first trains
        with user_terms(config):
            if auto.AUTO not in strategies:
                auto.check_unread(config)
            # (auto: its trials check each candidate)
            prepare_config(for_contender(config, auto.REFERENCE if name == auto.AUTO else name, strategies))
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise CadenceError(f"{out}: the comparison directory is not empty; use --overwrite or another --out")
    config = copy.deepcopy(config)
    with user_terms(config):
        resolve_update(config, strategies)  # (one algorithm for every contender, said once)
    if overwrite:
        shutil.rmtree(out / "repeats", ignore_errors=True)  # (an earlier comparison's further rounds)
    results: dict[str, Any] = {name: {"runs": []} for name in strategies}
    summaries: dict[str, list[dict[str, Any]]] = {name: [] for name in strategies}
    for round_ in range(repeats):
        for name in strategies:
            run_config = copy.deepcopy(config if name == auto.AUTO else for_contender(config, name, strategies))
            run_config.strategy = name
            run_config.out = str(out / name if round_ == 0 else out / "repeats" / str(round_ + 1) / name)
            if name != auto.AUTO and auto.AUTO in strategies:
                run_config.auto = AutoConfig()  # (the auto.* settings are the auto contender's)
            # (auto's trials train every candidate first: its own warm-up)
            batches = WARM_UP_BATCHES if warm and round_ == 0 and name != auto.AUTO else 0
            result = train(run_config, overwrite=overwrite, warm_up=batches)
            summaries[name].append(result.summary)
            results[name]["runs"].append(str(result.run_dir))
            if round_ == 0:
                results[name].update(summary=result.summary,
                                     curve=[r for r in result.metrics if r["split"] in ("valid", "next_period")])
    first = results[strategies[0]]["summary"]
    metric = first["primary_metric"]
    table = stats.statistics_of(summaries, stats.metrics_of(metric))
    from cadence.report import plots

    drawn = ["time_to_accuracy.png", "accuracy_per_epoch.png"] if plots.available() else None
    comparison = {"config": config.to_dict(), "repeats": repeats, "strategies": results, "stats": table,
                  "verdict": stats.verdict(table, metric, repeats), "plots": drawn}
    write_atomic(out / "comparison.json", json.dumps(finite(comparison), indent=2, allow_nan=False) + "\n")
    if drawn is None:
        log.warning("plots skipped: matplotlib is not installed (pip install 'cadence[plot]')")
        return comparison
    curves = {name: entry["curve"] for name, entry in results.items()}
    title = f"{first['dataset']}, {first['model']}"
    plots.plot_curves(curves, metric, "wall_seconds", "training wall seconds", title, out / "time_to_accuracy.png")
    plots.plot_curves(curves, metric, "epoch", "epoch", title, out / "accuracy_per_epoch.png")
    return comparison


def warm_up(config: Config, task: Task, batches: int) -> float:
    """Pay this process's one-time costs of training ``config`` (compiling kernels, the first touch of
    caches and thread pools) before a timed run: the first ``batches`` of epoch 0 on a scratch runtime,
    discarded (its own files, no fault injected, nothing recorded). Its seconds."""
    started = time.perf_counter()
    scratch_config = copy.deepcopy(config)
    scratch_config.ps.stragglers, scratch_config.ps.kill_workers = [], []
    with tempfile.TemporaryDirectory(prefix="cadence-warm-up-") as scratch:
        runtime = trial_runtime(scratch_config, task, Path(scratch))
        try:
            runtime.run_epoch(task.plan(0)[:max(1, batches)], lambda batch: None)
        finally:
            runtime.close()
    return time.perf_counter() - started


# ---- configuration checks ------------------------------------------------------------------------------
def prepare_config(config: Config) -> Config:
    """Resolve defaults that depend on the task (``model.name``, ``optimizer.entity``, the task's own:
    ``Task.resolve_defaults``) and reject what does not fit this run; no other side effect."""
    if config.model.name is None:
        config.model.name = DEFAULT_MODELS[config.task]
    if config.optimizer.entity is None:
        config.optimizer.entity = DEFAULT_ENTITY_OPTIMIZERS[config.task]
    resolve_update(config, [config.strategy])
    strategy = STRATEGIES.get(config.strategy)
    # (kge's train.negative_chunk: auto; mf's row and column blocks: auto, by the strategy's nodes)
    TASKS.get(config.task).resolve_defaults(config, strategy.node_parts(config))
    _check_init_from(config)
    runtime = strategy.runtime(config)
    order = config.record_order  # a file the run will write: a directory, or a missing parent, fails now
    if order and (Path(order).is_dir() or not Path(order).resolve().parent.is_dir()):
        raise ConfigError(f"record_order: {order} is a directory or in a directory that does not exist; "
                          "a file is expected")
    ENTITY_OPTIMIZERS.get(config.optimizer.entity)
    _check_foreign_keys(config, runtime)
    _check_unread_keys(config, strategy)
    _check_in_place(config, strategy)
    strategy.check(config)  # (first: a strategy's own word on the device is the clearer one)
    resolve_device(config.device)
    return config


AUTO_UPDATE = "auto"


def resolve_update(config: Config, strategies: Iterable[str], say: bool = True) -> None:
    """``w2v.update`` / ``mf.update``: ``auto`` becomes the task's in-place loop (word2vec's own,
    Surprise's: ``Task.update_choice``) where it applies under every strategy of ``strategies`` (a
    run's one; the contenders of ``compare`` and ``strategy: auto``, which then all train one
    algorithm), else ``batch``, said in one line with the reason. Once, here at the edge: config.yaml
    records the choice, so a resume trains as the run began. ``say``: log the line (once per run)."""
    choice = TASKS.get(config.task).update_choice
    if choice is None:
        return
    key, in_place = choice
    section = getattr(config, key.split(".")[0])
    if section.update != AUTO_UPDATE:
        return
    reason = _in_place_refusal(config, strategies, key, in_place)
    section.update = in_place if reason is None else "batch"
    if reason is not None and say:
        log.info("%s: auto -> batch updates: %s", key, reason)


def _in_place_refusal(config: Config, strategies: Iterable[str], key: str, in_place: str) -> str | None:
    """Why the task's in-place loop cannot run this config (None: it can), in the words of the checks
    that would refuse it if it were asked for."""
    if config.record_order or config.batch_order:
        return ("a run that records or replays a computation order trains batch updates, the sequential twin "
                "of an asynchronous run")
    trial = copy.deepcopy(config)
    getattr(trial, key.split(".")[0]).update = in_place
    try:
        TASKS.get(config.task).in_place_setting(trial)  # the optimizer, the compiled kernels, the device
        _check_init_from(trial)  # (frozen rows)
    except ConfigError as err:
        return str(err).removeprefix(f"{key}: ")
    names = [name for given in strategies for name in (candidates(config) if given == auto.AUTO else [given])]
    refused = [name for name in names if not STRATEGIES.get(name).in_place(trial)]
    if refused:
        able = [name for name in STRATEGIES.names() if STRATEGIES.get(name).in_place(trial)]
        return (f"strategy {', '.join(refused)} does not run the task's in-place loop ({key}: {in_place}), which "
                f"needs one process computing one batch at a time ({', '.join(able) or 'no strategy'} with "
                f"ps.workers={config.ps.workers}, ps.engine={config.ps.engine})")
    return None


def _check_init_from(config: Config) -> None:
    """``ctr.init_from`` (the old spelling) means ``train.init_from``; freezing needs a run to start from."""
    train = config.train
    if config.ctr.init_from:
        if train.init_from and train.init_from != config.ctr.init_from:
            raise ConfigError(f"ctr.init_from ({config.ctr.init_from}) and train.init_from ({train.init_from}) differ: "
                              "set train.init_from only (ctr.init_from is its old spelling)")
        train.init_from, config.ctr.init_from = config.ctr.init_from, None
    if train.freeze == "known" and not train.init_from:
        raise ConfigError("train.freeze: known freezes the rows of the run this one starts from; set train.init_from "
                          "(--init-from RUN)")
    if train.keep_dropped and not train.init_from:
        raise ConfigError("train.keep_dropped: read only with train.init_from (--init-from RUN): the ids of the run "
                          "this one starts from")
    if not train.freeze_dense and train.freeze != "known":
        raise ConfigError("train.freeze_dense: read only with train.freeze: known (nothing is frozen without it)")
    if train.freeze == "known" and TASKS.get(config.task).in_place_setting(config):
        key = TASKS.get(config.task).in_place_setting(config)
        raise ConfigError(f"train.freeze: known: {key} makes the task update its rows itself, in place, and it "
                          f"cannot leave some rows out; use {key}: batch")


def _check_in_place(config: Config, strategy: Strategy) -> None:
    """A task set to update its rows in place runs only under a strategy whose runtime can let it."""
    key = TASKS.get(config.task).in_place_setting(config)
    if key is None or strategy.in_place(config):
        return
    able = [name for name in STRATEGIES.names() if STRATEGIES.get(name).in_place(config)]
    where = (f"strategies {', '.join(able)} do" if able else
             f"none does with ps.workers={config.ps.workers}, ps.engine={config.ps.engine}: one process is needed")
    raise ConfigError(f"{key}: {flatten(config.to_dict())[key]} makes the task update its rows in place, as each "
                      f"step is computed; strategy {config.strategy} does not run such a task (it needs the rows in "
                      f"one process and one batch computed at a time; {where})")


def _check_foreign_keys(config: Config, runtime: RuntimeKind) -> None:
    """A key set away from its default that belongs to another task, or only to a runtime this run
    does not use, is a mistake (it would be silently ignored): an error naming it. (A mode's own
    keys, such as ps.tolerance, are ignored by the other modes on either runtime, as by design.)"""
    defaults = flatten(Config().to_dict())
    changed = {k for k, v in flatten(config.to_dict()).items() if defaults.get(k) != v}
    for name in TASKS.names():
        if name == config.task:
            continue
        for key in sorted(changed):
            if any(key == own or key.startswith(own + ".") for own in TASKS.get(name).own_keys):
                raise ConfigError(f"{key} belongs to the {name} task; this run's task is {config.task}")
    where = f"(strategy {config.strategy}, ps.workers={config.ps.workers}, ps.engine={config.ps.engine})"
    kinds = runtime_kinds()
    for key in sorted(changed):
        owners = [kind for kind in kinds if kind.owns(key)]
        if owners and runtime not in owners:
            raise ConfigError(runtime.refuse(key, owners[0], where))


def _measured_splits(config: Config) -> list[str]:
    """The splits a run measures metrics on: valid (with validation), test (with the final test)."""
    return [split for split, on in (("valid", config.eval.every > 0), ("test", config.eval.test)) if on]


def _choose_strategy(config: Config) -> tuple[Config, dict[str, Any], Task]:
    """``strategy: auto``: the config with the strategy its trials chose, the record, and the task
    (its data read once, for the trials and the run)."""
    make_task = _task_recipe(config)
    if config.auto.isolate:
        # each trial reads the data in its own process, and this one only after them: a memory cap
        # holds this process and a trial's together (a 900 MiB cap killed the OAC trial of a 2 GiB
        # out-of-core table while this process held the task: docs/auto.md)
        config, chosen = auto.choose(config, candidates(config), make_task, prepare_config, trial_runtime, for_contender)
        task = make_task()
    else:
        task = make_task()
        config, chosen = auto.choose(config, candidates(config), lambda: task, prepare_config, trial_runtime, for_contender)
    config = prepare_config(config)
    task.config = config
    return config, chosen, task


def _task_recipe(config: Config) -> functools.partial:
    """How a ``strategy: auto`` process builds the task (picklable): from the config as the reference
    candidate sees it (another candidate's strategy keys at their defaults)."""
    return functools.partial(TASKS.get(config.task), prepare_config(for_contender(config, auto.REFERENCE,
                                                                                  candidates(config))))


def candidates(config: Config) -> list[str]:
    """``strategy: auto``'s candidates for this config, from the strategies' own declarations
    (``auto.candidates`` over the registry)."""
    return auto.candidates(config, STRATEGIES)


def candidate_trial(config: Config, name: str) -> auto.Trial:
    """``strategy: auto``'s trial of candidate ``name`` on ``config``, whole: its config checked (one
    that cannot run here is a trial with the reason), the data read, its first batches trained."""
    names = candidates(config)
    try:
        candidate = prepare_config(for_contender(config, name, names))
    except ConfigError as err:
        return auto.Trial(name, None, note=str(err))
    return auto.run_trial(candidate, _task_recipe(config), trial_runtime,
                          config.auto)


def trial_runtime(candidate: Config, task: Task, scratch: Path) -> Runtime:
    """A ``strategy: auto`` candidate's runtime, its files in ``scratch`` (a table of its own beside
    ``store.path``'s, never in it)."""
    if candidate.store.path:
        candidate.store.path = str(Path(candidate.store.path).with_name(Path(candidate.store.path).name + "-auto-trial"))
    return build_runtime(candidate, task, RunDirectory(scratch))[0]


def _check_unread_keys(config: Config, strategy: Strategy) -> None:
    """A key set away from its default that the chosen strategy, optimizers, schedule or model do not
    read, though another one does, would be silently ignored: an error naming the key and who reads it.
    From each component's own declaration (``Strategy.reads``, ``EntityOptimizer.reads``,
    ``optim.DENSE_READS``, ``optim.schedule_reads``, an image model's ``reads``)."""
    defaults = flatten(Config().to_dict())
    changed = sorted(k for k, v in flatten(config.to_dict()).items() if defaults.get(k) != v)
    families: list[tuple[str, dict[str, tuple[str, ...]], str, tuple[str, ...]]] = [
        ("strategy", {name: STRATEGIES.get(name).reads for name in STRATEGIES.names()}, config.strategy,
         strategy.reads_for(config)),
        ("entity optimizer (optimizer.entity)", {name: ENTITY_OPTIMIZERS.get(name).reads for name in ENTITY_OPTIMIZERS.names()},
         config.optimizer.entity, ENTITY_OPTIMIZERS.get(config.optimizer.entity).reads),
        ("dense optimizer (optimizer.dense)", DENSE_READS, config.optimizer.dense, DENSE_READS[config.optimizer.dense]),
        ("schedule", {"optimizer.warmup_epochs > 0": ("optimizer.warmup_lr",)}, "without warm-up epochs",
         schedule_reads(config.optimizer))]
    if config.task == "image":
        families.append(("image model (model.name)", {name: IMAGE_MODELS.get(name).reads for name in IMAGE_MODELS.names()},
                         config.model.name, IMAGE_MODELS.get(config.model.name).reads))
    ignored = strategy.unread(config)
    for key in changed:
        if key in ignored:
            raise ConfigError(f"{key}: strategy {config.strategy} does not read it ({ignored[key]}; remove it)")
    for name, value in vars(config).items():  # keys a section's own values leave unread (store.path in memory)
        quiet = value.unread() if hasattr(value, "unread") else {}
        for key in changed:
            leaf = key.removeprefix(f"{name}.")
            if key.startswith(f"{name}.") and leaf in quiet:
                reader, this_run = quiet[leaf]
                raise ConfigError(f"{key}: read only with {reader}; this run has {this_run}, which leaves it "
                                  "unread (remove it)")
    read_now = [key for *_, reads in families for key in reads]
    for key in changed:
        if any(_covers(own, key) for own in read_now):
            continue
        for family, declared, chosen, _ in families:
            readers = [name for name, reads in declared.items() if any(_covers(own, key) for own in reads)]
            if readers:
                raise ConfigError(f"{key}: read only by the {family} {', '.join(readers)}; this run's is {chosen}, "
                                  "which does not read it (remove it, or choose one that reads it)")


def _covers(declared: str, key: str) -> bool:
    return key == declared or key.startswith(declared + ".")


def for_contender(config: Config, name: str, contenders: Iterable[str]) -> Config:
    """``config`` for strategy ``name`` among ``contenders`` run side by side on one config
    (``compare``, ``strategy: auto``): a strategy key another contender reads, this one not, is that
    contender's setting, back to its default here (a key no contender reads stays: an error)."""
    config = copy.deepcopy(config)
    resolve_update(config, contenders, say=False)  # (before the strategy is set: one algorithm for every contender)
    config.strategy = name
    mine = STRATEGIES.get(name).reads_for(config)
    others = [key for other in contenders if other != name and other in STRATEGIES.names()
              for key in STRATEGIES.get(other).reads]
    defaults = flatten(Config().to_dict())
    for key, value in flatten(config.to_dict()).items():
        if value != defaults.get(key) and not any(_covers(own, key) for own in mine) \
                and any(_covers(other, key) for other in others):
            *path, leaf = key.split(".")
            section = config
            for part in path:
                section = getattr(section, part)
            setattr(section, leaf, copy.deepcopy(getattr(_default_section(path), leaf)))
    return config


def _default_section(path: list[str]) -> Any:
    section: Any = Config()
    for part in path:
        section = getattr(section, part)
    return section


def _init_checkpoint(config: Config, task: Task) -> tuple[Task, tuple[dict[str, torch.Tensor], dict[str, Any],
                                                                      grow.Growth] | None]:
    """(the task, with the ids it keeps; the model a run with ``train.init_from`` starts from, laid
    out on this run's data: ``cadence.training.grow``)."""
    if not config.train.init_from:
        return task, None
    run = RunDirectory(config.train.init_from)
    if not run.config_path.is_file():
        raise CheckpointError(f"{config.train.init_from}: no final checkpoint to start from (not a cadence run "
                              "directory: no config.yaml)")
    source = run.load_config()
    if source.task != config.task:
        raise CheckpointError(f"{config.train.init_from}: a run of the {source.task} task; this run's task is "
                              f"{config.task}")
    theirs, ours = source.model.name or DEFAULT_MODELS[source.task], config.model.name or DEFAULT_MODELS[config.task]
    if theirs != ours:  # (one model's rows read as another's: silently wrong, or a shape error later; a
        # changed model.dim is refused by the rows' width, a changed layer by its shape: ``grow``)
        raise CheckpointError(f"{config.train.init_from}: a run of model.name {theirs}; this run's is {ours}: a grown "
                              f"model keeps its model (--model {theirs}, or train from scratch)")
    tensors, state = final_checkpoint(run)
    kept, original = None, task
    if config.train.keep_dropped:
        task, kept = grow.keep_dropped(run.path, tensors, state, task)
    return task, grow.grow(run.path, tensors, state, task, config.train, config.optimizer, kept, original)


# ---- composition -------------------------------------------------------------------------------------------
def build_runtime(config: Config, task: Task, run: RunDirectory) -> tuple[Runtime, torch.device]:
    _connect(config)  # (again where ``train`` did: the run's Ray settings hold for this runtime too)
    torch.set_num_threads(config.threads or usable_cores())  # explicitly: never more than the process may use
    device = resolve_device(config.device)
    use_deterministic_kernels(device, config.deterministic)
    context = BuildContext(device, config.store.path or str(run.path / "store"))
    return STRATEGIES.get(config.strategy).build(config, task, context), device


def _connect(config: Config) -> None:
    """Join the Ray cluster of a run on the ``ray`` engine (a clear error within seconds if it
    cannot be reached)."""
    if STRATEGIES.get(config.strategy).runtime(config).engine and config.ps.engine == "ray":
        from cadence.engines.ray import connect

        connect(config.ps.ray_address, config.threads, config.ps.ray_idle_processes)


def build_trainer(config: Config, task: Task, run: RunDirectory, hooks: Iterable[TrainerHook] = ()) -> Trainer:
    """Compose the task, its runtime and the trainer for one run."""
    runtime, device = build_runtime(config, task, run)
    return Trainer(config, task, runtime, run, device, hooks)


def _fit(trainer: Trainer, run: RunDirectory) -> TrainResult:
    try:
        summary = trainer.fit()
    except Exception as err:
        lost = next((cause for cause in (err, err.__cause__, err.__context__) if cause is not None
                     and lost_process(cause)), None)
        if lost is None:
            raise
        detail = str(lost).strip().splitlines()[0] if str(lost).strip() else type(lost).__name__
        # (the calls still pending on the dead process fail with it: Ray's driver would log each one's
        # traceback as it exits, after this run's one line)
        os.environ["RAY_IGNORE_UNHANDLED_ERRORS"] = "1"
        raise ProcessLost(f"a process of this run died during epoch {trainer.progress.epoch + 1} ({detail}); the "
                          f"newest checkpoint is whole: cadence train --resume {run.path}") from None
    finally:
        try:
            trainer.runtime.close()
        except Exception as err:  # (closing asks the dead process too)
            if not lost_process(err):
                raise
    run.write_summary(summary)
    return TrainResult(run.path, summary, run.read_metrics())


# ---- finished runs ------------------------------------------------------------------------------------------
def final_checkpoint(run: RunDirectory) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The model a finished run reports on: its ``final`` checkpoint (the best one under early
    stopping), else the best, else the newest (a run that was stopped)."""
    named = [ckpt.checkpoint_root(run.path) / name for name in ("final", "best")]
    existing = [path for path in named if path.is_dir()]
    if existing:
        tensors, state = ckpt.load_checkpoint(existing[0])
    else:
        found = ckpt.load_latest(run.path)
        if found is None:
            raise CheckpointError(f"{run.path}: the run has no checkpoint to load (checkpoint.every: 0?)")
        tensors, state = found[0], found[1]
    return _upgrade(tensors), state


def _upgrade(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Checkpoints of cadence 0.1 (knowledge graphs only) in today's format."""
    if "store.values" not in tensors:
        return tensors
    upgraded = {k: v for k, v in tensors.items() if not k.startswith(("store.", "model."))}
    upgraded.update({f"table.{k[len('store.'):]}": v for k, v in tensors.items() if k.startswith("store.")})
    upgraded["table.keys"] = torch.arange(tensors["store.values"].shape[0])
    upgraded["dense.relations"] = tensors["model.relations"]
    return upgraded


def load_model(run_dir: str | Path) -> tuple[Config, Task, RowsView, torch.nn.Module]:
    """A finished run's config, task, trained rows (a ``ParameterView``) and dense module."""
    run = RunDirectory(run_dir)
    config = prepare_config(run.load_config())
    task = grow.restore_kept(run.path, TASKS.get(config.task)(config))  # (with the ids a grown run kept)
    tensors, state = final_checkpoint(run)
    try:
        fingerprint.check(state.get(fingerprint.KEY), task.data_fingerprint(), run.path, config.data.dataset)
    except ValueError as err:
        raise CheckpointError(f"{run.path}: its final checkpoint does not fit this run ({err})") from None
    view = RowsView(tensors["table.values"], task.table(), KeyIndex(tensors["table.keys"]))
    dense = task.dense_module()
    dense.load_state_dict({k[len("dense."):]: v for k, v in tensors.items() if k.startswith("dense.")})
    return config, task, view, dense


def load(run_dir: str | Path) -> Predictor:
    """A finished run's final model, to be asked: the predictor of its task (``cadence.prediction``;
    ``Task.predictor``), e.g. ``cadence.load(run).tails("virus", "causes", top=5)``."""
    _, task, view, dense = load_model(run_dir)
    return task.predictor(view, dense)


def predictor_type(run_dir: str | Path) -> type[Predictor]:
    """The kind of predictor ``load`` gives for ``run_dir`` (its ``queries``), from the run's config
    alone: a question its task does not answer is refused before the model and data are read."""
    kind = TASKS.get(RunDirectory(run_dir).load_config().task).predictor_type
    if kind is None:
        raise QueryError(f"{run_dir}: its task answers no queries")
    return kind


def predict(run_dir: str | Path, verb: str, arguments: list[str], out: str | Path | None = None,
            **options: Any) -> Prediction:
    """``cadence predict``: the answer of the run's final model to question ``verb`` (a ``Query`` of
    its task) with ``arguments`` as typed and keyword ``options``; with ``out``, also written there as
    TSV, whole or not at all."""
    query = predictor_type(run_dir).query(verb)
    answer = query.ask(load(run_dir), arguments, **options)
    if out is not None:
        write_atomic(Path(out), answer.tsv())
    return answer


def evaluate(run_dir: str | Path, split: str = "test") -> dict[str, float]:
    """The task's metrics of a run's final model on ``split``."""
    _, task, view, dense = load_model(run_dir)
    task.check_splits([split])
    return task.evaluate(view, dense, split, torch.device("cpu"), lambda steps: steps)


def export(run_dir: str | Path, out: str | Path, format: str = "npy") -> list[Path]:
    """Write a run's final parameters in ``format`` (the task's formats); all files or none."""
    run = RunDirectory(run_dir)
    if Path(out).resolve() == run.path.resolve():
        raise ConfigError(f"export --out {out}: that is the run directory itself (its id maps and files would be "
                          "overwritten); choose another directory")
    if Path(out).exists() and not Path(out).is_dir():
        raise ConfigError(f"export --out {out}: is a file; --out must name a directory")
    _, task, view, dense = load_model(run.path)
    if format not in task.export_formats:
        raise ConfigError(f"export format {format!r} is not supported by the {task.name} task "
                          f"({', '.join(task.export_formats)})")
    out = Path(out)
    made = not out.exists()
    staging = None
    final: list[Path] = []
    try:
        with os_errors(out, "write the export"):
            out.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=".export-", dir=out))
            written = task.export(view, dense, run.path, staging, format)
            for path in written:
                target = out / path.name
                path.replace(target)
                final.append(target)
            return final
    except BaseException:
        for path in final:  # all files or none
            path.unlink(missing_ok=True)
        if made:  # the directory made for the export goes too
            shutil.rmtree(out, ignore_errors=True)
        raise
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
