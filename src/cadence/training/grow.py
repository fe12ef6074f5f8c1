"""Growing a trained model onto data whose vocabulary changed (``train.init_from``).

A run writes ``vocabulary.json`` beside its checkpoints: the name of every row (``Task.vocabulary``).
A run started from it reads that file and its final checkpoint and builds this run's starting model:

- every id both know (by name: an entity, relation, user, item, word; a CTR feature by its key)
  keeps its trained row and its optimizer state;
- every id new to this run gets the row a run from scratch on this data would start from (the
  task's seeded initial row; its dense rows from the task's seeded dense module) and fresh state;
- every id the data no longer has is dropped, or with ``train.keep_dropped`` kept: added to this
  run's vocabulary after its own ids (``Task.keeping``), its row carried, never trained;
- dense parameters that are not vocabulary rows are taken as they are (they must have the same
  shape); buffers (statistics of the data: MF's global mean, the image standardisation) are this
  data's.

``train.freeze: known`` then trains only the new rows (``Frozen``): the known rows get no gradient,
the known rows of a dense vocabulary parameter neither, and with ``train.freeze_dense`` every other
dense parameter is stepped at rate 0. What was matched, added and dropped is one log line and the
``init_from`` entry of summary.json; the grown run records its own data's fingerprint.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from cadence.config import OptimizerConfig, TrainConfig
from cadence.core import checkpoint as ckpt
from cadence.core.keys import KeyIndex
from cadence.errors import CheckpointError, ConfigError
from cadence.optim import ENTITY_OPTIMIZERS, module_optimizer
from cadence.tasks.base import Frozen, Task, Vocabulary

log = logging.getLogger("cadence")

VOCABULARY_FILE = "vocabulary.json"  # in every run directory: the names of the rows
GROWN_FILE = "init_from.json"  # in a grown run: what it started from (read again on resume)
FROZEN_FILE = "frozen.safetensors"  # in a grown run with train.freeze: known: what does not train
# optimizer state that moves a parameter even at a zero gradient (zeroed for a frozen row)
MOMENTUM_STATE = ("exp_avg", "momentum_buffer")


# ---- the vocabulary file --------------------------------------------------------------------------------
def write_vocabulary(run_dir: Path, vocabulary: Vocabulary) -> None:
    body = {"parts": vocabulary.parts, "dense": vocabulary.dense, "same": vocabulary.same}
    (Path(run_dir) / VOCABULARY_FILE).write_text(json.dumps(body, ensure_ascii=False), encoding="utf-8")


def read_vocabulary(run_dir: Path) -> Vocabulary | None:
    """The vocabulary a run wrote, or None (a run of cadence before it wrote one)."""
    path = Path(run_dir) / VOCABULARY_FILE
    if not path.is_file():
        return None
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
        parts = None if body["parts"] is None else {k: tuple(v) for k, v in body["parts"].items()}
        return Vocabulary(parts, {k: tuple(v) for k, v in body["dense"].items()},
                          {k: tuple(v) for k, v in body["same"].items()})
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise CheckpointError(f"{path}: not a vocabulary cadence wrote ({err})") from None


# ---- what a growth did ----------------------------------------------------------------------------------
@dataclass
class Counts:
    matched: int = 0
    added: int = 0
    dropped: int = 0
    kept: int = 0  # ids this data lacks whose rows were kept (train.keep_dropped)

    def text(self) -> str:
        gone = f"{self.kept:,} kept" if self.kept else f"{self.dropped:,} dropped"
        return f"{self.matched:,} matched, {self.added:,} added, {gone}"


@dataclass
class Growth:
    """What ``grow`` did: counts per row part and per dense vocabulary parameter, and what is frozen."""

    run: str
    parts: dict[str, Counts] = field(default_factory=dict)
    dense: dict[str, Counts] = field(default_factory=dict)
    by_key: bool = False  # rows matched by key (a growing table, or a run without vocabulary.json)
    freeze: str = "none"
    frozen: Frozen | None = None

    def line(self) -> str:
        pieces = [f"{name} {counts.text()}" for name, counts in {**self.parts, **self.dense}.items()]
        frozen = "" if self.frozen is None else "; only the new rows train (train.freeze: known)"
        return f"initialised from {self.run}: {'; '.join(pieces) or 'no rows'}{frozen}"

    def summary(self) -> dict[str, Any]:
        """The ``init_from`` entry of summary.json."""
        return {"run": self.run, "freeze": self.freeze,
                **{name: vars(counts) for name, counts in {**self.parts, **self.dense}.items()}}

    def save(self, run_dir: Path) -> None:
        """``init_from.json`` (and ``frozen.safetensors``) in the new run: a resume freezes the same rows."""
        (Path(run_dir) / GROWN_FILE).write_text(json.dumps(self.summary(), indent=1) + "\n", encoding="utf-8")
        if self.frozen is not None:
            tensors = {"keys": self.frozen.keys.contiguous(),
                       **{f"dense.{k}": v.to(torch.uint8).contiguous() for k, v in self.frozen.dense_rows.items()},
                       "dense": torch.tensor([int(self.frozen.dense)], dtype=torch.uint8)}
            save_file(tensors, str(Path(run_dir) / FROZEN_FILE))


def load_growth(run_dir: Path) -> tuple[dict[str, Any] | None, Frozen | None]:
    """(the ``init_from`` summary entry, what is frozen) a grown run saved; (None, None) for another."""
    path = Path(run_dir) / GROWN_FILE
    if not path.is_file():
        return None, None
    summary = json.loads(path.read_text(encoding="utf-8"))
    frozen_path = Path(run_dir) / FROZEN_FILE
    if not frozen_path.is_file():
        return summary, None
    tensors = load_file(str(frozen_path))
    dense_rows = {k[len("dense."):]: v.bool() for k, v in tensors.items() if k.startswith("dense.")}
    return summary, Frozen(tensors["keys"], dense_rows, bool(tensors["dense"][0]))


# ---- growing ------------------------------------------------------------------------------------------------
KEPT_FILE = "kept.json"  # in a grown run with train.keep_dropped: the ids it kept (its tasks are rebuilt with them)
KEPT_KEYS_FILE = "kept.safetensors"  # (a growing table's kept keys)


def save_kept(run_dir: Path, original: Task, task: Task) -> None:
    """What ``keep_dropped`` added to ``original``'s vocabulary, beside the run: a resume, ``eval``
    and ``export`` rebuild the run's task with it (``restore_kept``)."""
    before, after = original.vocabulary(), task.vocabulary()
    if after.parts is None:
        keys = getattr(task, "kept_keys", None)
        save_file({"keys": (keys if keys is not None else torch.empty(0, dtype=torch.int64)).contiguous()},
                  str(Path(run_dir) / KEPT_KEYS_FILE))
        body: dict[str, Any] = {"parts": None, "dense": {}}
    else:
        body = {"parts": {k: list(v[len(before.parts[k]):]) for k, v in after.parts.items()},
                "dense": {k: list(v[len(before.dense[k]):]) for k, v in after.dense.items()}}
    (Path(run_dir) / KEPT_FILE).write_text(json.dumps(body, ensure_ascii=False), encoding="utf-8")


def restore_kept(run_dir: Path, task: Task) -> Task:
    """``task`` (built from a run's config) with the ids that run kept, if it kept any."""
    path = Path(run_dir) / KEPT_FILE
    if not path.is_file():
        return task
    body = json.loads(path.read_text(encoding="utf-8"))
    if body["parts"] is None:
        return task.keeping(Vocabulary(None), load_file(str(Path(run_dir) / KEPT_KEYS_FILE))["keys"])
    return task.keeping(Vocabulary({k: tuple(v) for k, v in body["parts"].items()},
                                   {k: tuple(v) for k, v in body["dense"].items()}), torch.empty(0, dtype=torch.int64))


def keep_dropped(run_dir: str | Path, tensors: dict[str, Tensor], meta: dict[str, Any],
                 task: Task) -> tuple[Task, dict[str, int]]:
    """(``task`` with the ids the run knew and its data lacks added to its vocabulary, how many were
    kept per part): ``train.keep_dropped``."""
    old = read_vocabulary(Path(run_dir))
    if old is None:
        raise CheckpointError(f"{run_dir}: no {VOCABULARY_FILE} (a run of an older cadence): train.keep_dropped needs "
                              "the names of its rows")
    before = task.vocabulary()
    if before.parts is None:  # a growing table: its keys are the names
        if "table.keys" not in tensors and meta.get(ckpt.PARTS) is not None:
            tensors = {**tensors, **ckpt.read_tables(meta)}
        keys = tensors["table.keys"]
        kept = keys[~torch.isin(keys, task.known_keys())]
        return task.keeping(Vocabulary(None), kept), {"rows": int(kept.numel())}
    parts = {name: tuple(n for n in (old.parts or {}).get(name, ()) if n not in set(names))
             for name, names in before.parts.items()}
    dense = {name: tuple(n for n in old.dense.get(name, ()) if n not in set(names)) for name, names in before.dense.items()}
    grown = task.keeping(Vocabulary(parts, dense), torch.empty(0, dtype=torch.int64))
    after = grown.vocabulary()
    counts = {}
    for name, names in {**(after.parts or {}), **after.dense}.items():
        known = set((old.parts or {}).get(name, ())) | set(old.dense.get(name, ()))
        previous = {**(before.parts or {}), **before.dense}.get(name, ())
        counts[name] = len(known & set(names)) - len(known & set(previous))
    return grown, counts



def grow(run_dir: str | Path, tensors: dict[str, Tensor], meta: dict[str, Any], task: Task,
         train: TrainConfig, optimizer: OptimizerConfig,
         kept: dict[str, int] | None = None,
         original: Task | None = None) -> tuple[dict[str, Tensor], dict[str, Any], Growth]:
    """This run's starting model from the final checkpoint (``tensors``, ``meta``) of the run in
    ``run_dir``: its rows and dense parameters laid out on this task's vocabulary (the module
    docstring); sets ``task.frozen``. ``kept`` and ``original`` (the task before ``keep_dropped``
    added ids to it): a new id's initial row is the one a scratch run on the data starts from, which a
    larger vocabulary would draw otherwise. Errors (``CheckpointError``, ``ConfigError``) name what does not
    fit, before anything is written."""
    if "table.keys" not in tensors and meta.get(ckpt.PARTS) is not None:
        tensors = {**tensors, **ckpt.read_tables(meta)}  # rows a parameter server's shards wrote in parts
    new = task.vocabulary()
    old = read_vocabulary(Path(run_dir))
    growth = Growth(str(run_dir), freeze=train.freeze)
    if old is None:  # (a run of cadence before vocabulary.json: its ids must be this data's)
        log.warning("%s has no %s (an older run): its rows are matched by id", run_dir, VOCABULARY_FILE)
        old = Vocabulary(None if new.parts is None else {}, dict(new.dense), dict(new.same))
        growth.by_key = True
    for what, names in new.same.items():
        if old.same.get(what, names) != names:
            raise CheckpointError(f"{run_dir}: its {what} differ from this run's data ({_differ(old.same[what], names)}); "
                                  f"a grown model keeps its {what}")
    fresh = task.dense_module()
    out = {k: v for k, v in tensors.items() if not k.startswith(("table.", "dense.", "optimizer."))}
    scratch = original or task
    known_keys = _grow_table(run_dir, tensors, old, new, task, optimizer, out, growth, scratch)
    frozen_rows = _grow_dense(run_dir, tensors, meta, old, new, fresh, out, growth, scratch)
    for name, count in (kept or {}).items():  # (matched by name, as any known id: counted as kept)
        counts = growth.parts.get(name) or growth.dense.get(name)
        if counts is not None:
            counts.matched, counts.kept = counts.matched - count, count
    if train.freeze == "known" and train.freeze_dense and optimizer.weight_decay and any(
            bool(rows.any()) for rows in frozen_rows.values()):
        raise ConfigError(f"optimizer.weight_decay: {optimizer.weight_decay} would still move the frozen rows of "
                          f"{', '.join(frozen_rows)} under train.freeze: known; set it to 0, or train.freeze_dense: false")
    if train.freeze == "known":
        growth.frozen = Frozen(known_keys, frozen_rows if train.freeze_dense else {}, train.freeze_dense)
        if train.freeze_dense:
            _zero_momentum(out, fresh, frozen_rows)
    task.frozen = growth.frozen  # (before a runtime builds the task's dense modules and recipes)
    meta = {**meta, "dense_optimizer": _optimizer_meta(meta, optimizer, task, out, run_dir)}
    return out, meta, growth


def _grow_table(run_dir, tensors: dict[str, Tensor], old: Vocabulary, new: Vocabulary, task: Task,
                optimizer: OptimizerConfig, out: dict[str, Tensor], growth: Growth, scratch: Task) -> Tensor:
    """This run's ``table.*`` in ``out``; returns the (sorted) keys whose rows came from the run."""
    spec = task.table()
    old_keys, old_values = tensors["table.keys"], tensors["table.values"]
    if old_values.shape[0] and old_values.shape[1] != spec.width:
        raise CheckpointError(f"{run_dir}: its rows are {old_values.shape[1]} wide, this run's {spec.width} "
                              "(model.dim or model.name changed)")
    width = ENTITY_OPTIMIZERS.get(optimizer.entity).state_width(spec.width)
    old_state = tensors["table.state"]
    if old_state.shape[0] and old_state.shape[1] != width:
        log.warning("%s: its row optimizer state is %d wide, this run's %d (optimizer.entity changed): every row's "
                    "state starts afresh", run_dir, old_state.shape[1], width)
        old_state = None
    if new.parts is None or growth.by_key:  # keys are names (a growing table), or ids are kept
        keys = task.known_keys()
        position, found = KeyIndex(old_keys).locate(keys)
        source, target = position[found], found.nonzero().squeeze(1)
        counts = Counts(int(found.sum()), int((~found).sum()), old_keys.shape[0] - int(found.sum()))
        growth.parts["rows" if new.parts is None else "ids"] = counts
    else:
        keys = torch.arange(spec.rows)
        source, target = _match_parts(run_dir, old_keys, old.parts or {}, new.parts, growth)
    values = spec.initial_values(keys) if keys.numel() else torch.empty(0, spec.width)
    if scratch is not task and new.parts:  # (kept ids: the data's own ids start as a scratch run's do)
        original = scratch.vocabulary().parts or {}
        initial = scratch.table().initial_values(torch.arange(scratch.table().rows or 0))
        start = origin = 0
        for name, names in new.parts.items():
            count = len(original.get(name, ()))
            values[start:start + count] = initial[origin:origin + count]
            start, origin = start + len(names), origin + count
    state = torch.zeros(keys.shape[0], width)
    values[target] = old_values[source]
    if old_state is not None:
        state[target] = old_state[source]
    out.update({"table.keys": keys, "table.values": values, "table.state": state})
    return keys[target].sort().values


def _match_parts(run_dir, old_keys: Tensor, old: dict[str, tuple[str, ...]], new: dict[str, tuple[str, ...]],
                 growth: Growth) -> tuple[Tensor, Tensor]:
    """(rows of the checkpoint, this run's keys) of the ids both know, part by part, by name."""
    missing = sorted(set(old) - set(new)) or sorted(set(new) - set(old))
    if missing:
        raise CheckpointError(f"{run_dir}: its rows are {', '.join(old) or 'none'}, this run's {', '.join(new) or 'none'} "
                              "(a run of another model or task)")
    row_of_key = torch.full((sum(len(names) for names in old.values()),), -1, dtype=torch.int64)
    row_of_key[old_keys[old_keys < row_of_key.shape[0]]] = (old_keys < row_of_key.shape[0]).nonzero().squeeze(1)
    sources, targets = [], []
    old_start = new_start = 0
    for name, names in new.items():
        old_names = old[name]
        index = {item: i for i, item in enumerate(old_names)}
        if len(index) != len(old_names) or len(set(names)) != len(names):
            raise CheckpointError(f"{run_dir}: {name} are not unique by name; a grown model matches them by name")
        pairs = [(index[item], i) for i, item in enumerate(names) if item in index]
        source = torch.tensor([p[0] for p in pairs], dtype=torch.int64) + old_start
        target = torch.tensor([p[1] for p in pairs], dtype=torch.int64) + new_start
        present = row_of_key[source] >= 0  # (a checkpoint holds every key of a fixed table)
        sources.append(row_of_key[source[present]])
        targets.append(target[present])
        growth.parts[name] = Counts(len(pairs), len(names) - len(pairs), len(old_names) - len(pairs))
        old_start, new_start = old_start + len(old_names), new_start + len(names)
    if not sources:
        return torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64)
    return torch.cat(sources), torch.cat(targets)


def _grow_dense(run_dir, tensors: dict[str, Tensor], meta: dict[str, Any], old: Vocabulary, new: Vocabulary,
                fresh: torch.nn.Module, out: dict[str, Tensor], growth: Growth, scratch: Task) -> dict[str, Tensor]:
    """This run's ``dense.*`` and ``optimizer.*`` in ``out``; returns, per dense vocabulary parameter,
    the rows that came from the run (True)."""
    parameters = dict(fresh.named_parameters())
    index_of = {name: i for i, name in enumerate(parameters)}
    known: dict[str, Tensor] = {}
    theirs = sorted(k.removeprefix("dense.") for k in tensors if k.startswith("dense.")
                    and k.removeprefix("dense.") not in fresh.state_dict())
    if theirs:  # (a part of the trained model this one has no place for would be dropped without a word)
        raise CheckpointError(f"{run_dir}: its model has {', '.join(theirs[:4])}{' ...' if len(theirs) > 4 else ''}, "
                              "which this run's has not (a run of another model or of other layer sizes)")
    for name, value in fresh.state_dict().items():
        key = f"dense.{name}"
        if name not in parameters:  # a buffer: a statistic of this run's data
            out[key] = value.detach().clone()
            continue
        if key not in tensors:
            raise CheckpointError(f"{run_dir}: its model has no {name} (a run of another model or task)")
        state = {k: v for k, v in tensors.items() if k.startswith(f"optimizer.{index_of[name]}.")}
        if name in new.dense:
            rows = new.dense[name]
            source, target = _match_names(run_dir, name, old.dense.get(name, rows), rows, growth)
            grown = value.detach().clone()
            if scratch is not None and name in scratch.vocabulary().dense:  # (kept ids: as a scratch run's)
                originals = scratch.vocabulary().dense[name]
                at = {item: i for i, item in enumerate(rows)}
                initial = scratch.dense_module().state_dict()[name]
                grown[torch.tensor([at[item] for item in originals], dtype=torch.int64)] = initial
            grown[target] = tensors[key][source].to(grown.dtype)
            out[key] = grown
            for state_key, old_state in state.items():
                if old_state.dim() and old_state.shape[0] == tensors[key].shape[0]:
                    new_state = torch.zeros((len(rows), *old_state.shape[1:]), dtype=old_state.dtype)
                    new_state[target] = old_state[source]
                    out[state_key] = new_state
                else:
                    out[state_key] = old_state
            known[name] = torch.zeros(len(rows), dtype=torch.bool).index_fill_(0, target, True)
            continue
        if tensors[key].shape != value.shape:
            raise CheckpointError(f"{run_dir}: its {name} is {tuple(tensors[key].shape)}, this run's {tuple(value.shape)} "
                                  "(a grown model keeps the shape of its dense parameters)")
        out[key] = tensors[key]
        out.update(state)
    return known


def _match_names(run_dir, what: str, old: Sequence[str], new: Sequence[str], growth: Growth) -> tuple[Tensor, Tensor]:
    index = {item: i for i, item in enumerate(old)}
    if len(index) != len(old) or len(set(new)) != len(new):
        raise CheckpointError(f"{run_dir}: {what} are not unique by name; a grown model matches them by name")
    pairs = [(index[item], i) for i, item in enumerate(new) if item in index]
    growth.dense[what] = Counts(len(pairs), len(new) - len(pairs), len(old) - len(pairs))
    return (torch.tensor([p[0] for p in pairs], dtype=torch.int64),
            torch.tensor([p[1] for p in pairs], dtype=torch.int64))


def _optimizer_meta(meta: dict[str, Any], optimizer: OptimizerConfig, task: Task, out: dict[str, Tensor],
                    run_dir) -> dict[str, Any]:
    """The dense optimizer's groups as this run's config makes them (its rates, its frozen parameters),
    with the run's state; state of another kind of optimizer (optimizer.dense changed) is dropped."""
    made = module_optimizer(optimizer, task.dense_module())
    if made is None:
        return {}
    groups = made.state_dict()["param_groups"]
    old = meta.get("dense_optimizer") or {}
    old_groups = old.get("param_groups") or []
    if not old_groups or set(old_groups[0]) - {"frozen"} != set(groups[0]) - {"frozen"}:
        if old_groups:
            log.warning("%s: its dense optimizer differs from this run's (optimizer.dense changed): the dense "
                        "optimizer state starts afresh", run_dir)
        for key in [k for k in out if k.startswith("optimizer.")]:
            del out[key]
        return {"param_groups": groups, "scalars": {}}
    return {"param_groups": groups, "scalars": old.get("scalars", {})}


def _zero_momentum(out: dict[str, Tensor], fresh: torch.nn.Module, frozen_rows: dict[str, Tensor]) -> None:
    """Zero the momentum of frozen dense rows: a zero gradient leaves them as they are only then."""
    for index, (name, _) in enumerate(fresh.named_parameters()):
        if name not in frozen_rows:
            continue
        for kind in MOMENTUM_STATE:
            state = out.get(f"optimizer.{index}.{kind}")
            if state is not None:
                state[frozen_rows[name]] = 0.0


def _differ(old: Sequence[str], new: Sequence[str]) -> str:
    gone, added = [x for x in old if x not in set(new)], [x for x in new if x not in set(old)]
    parts = [f"{len(gone)} gone: {', '.join(gone[:3])}" if gone else "",
             f"{len(added)} new: {', '.join(added[:3])}" if added else ""]
    return "; ".join(p for p in parts if p) or "the same names in another order"
