"""A parameter-server shard: embedding rows (a dynamic vocabulary), optionally the dense
parameters, their optimizers, and the aggregation rule of the mode being trained (GBA, SPEC
section 3). Every push, drop and token event happens under the shard's lock; ``apply`` is the one
place where gradients become an optimizer step, and it advances the shard's global step. Under a
lock-free aggregation (``Hogwild``: ShadowSync's modes) pulls and pushes reach the rows without
that lock (what a reader may see: ``store.embedding_table``); only the counters take a lock of their
own, ``counting``, held for a few additions.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor, nn

from cadence.config import OptimizerConfig
from cadence.ps.settings import ParameterServerConfig
from cadence.core.rows import TableSpec
from cadence.optim import EntityOptimizer, set_lr, module_optimizer
from cadence.ps.aggregation import Aggregation, Gradient
from cadence.store.embedding_table import DynamicEmbeddingTable, FixedTable
from cadence.core import checkpoint as ckpt
from cadence.engines.placement import verb_of


def build_shard(optimizer_settings: OptimizerConfig, ps: ParameterServerConfig, entity: type[EntityOptimizer],
                spec: TableSpec, mode, index: int, dense: nn.Module | None) -> "ServerShard":
    """Server shard ``index`` of ``ps.shards`` for a task's ``TableSpec``: the rows it owns
    (``FixedTable``) or a growing vocabulary, the entity optimizer, the mode's aggregation, and on
    shard 0 the dense module with its optimizer (``entity``: the entity optimizer's class, resolved
    once from the config). The same in a thread and in a Ray actor."""
    state_width = entity.state_width(spec.width)
    if spec.fixed:
        table = FixedTable(spec, state_width, index, ps.shards)
    else:
        table = DynamicEmbeddingTable(spec.width, state_width, spec.init_std, spec.seed & 0xFFFFFFFF)
    optimizer = None if dense is None else module_optimizer(optimizer_settings, dense)
    return ServerShard(table, entity(optimizer_settings), mode.aggregation(ps), dense, optimizer)


class Done:
    """The result of a call that has already happened (a local shard's ``submit``)."""

    def __init__(self, value: Any):
        self.value = value

    def result(self) -> Any:
        return self.value


class Aborted(RuntimeError):
    """The epoch was abandoned while this call waited (another worker failed)."""


def _histogram(counts: Counter[int]) -> dict[str, int]:
    """{value: count} in ascending order of value, keyed by text (JSON: summary.json)."""
    return {str(value): counts[value] for value in sorted(counts)}


class ServerShard:
    def __init__(self, table: DynamicEmbeddingTable | FixedTable, entity_optimizer: EntityOptimizer,
                 aggregation: Aggregation, dense: nn.Module | None = None,
                 dense_optimizer: torch.optim.Optimizer | None = None):
        self.table = table
        self.width = table.width
        self.entity_optimizer = entity_optimizer
        self.aggregation = aggregation
        self.dense = dense
        self.dense_optimizer = dense_optimizer
        self.changed = threading.Condition()  # guards everything below; notified on every step
        self.lock_free = aggregation.lock_free  # Hogwild rows: pulls and pushes never take ``changed``
        self.counting = threading.Lock()  # the counters of a lock-free push
        self.global_step = 0
        self.applied_gradients = 0
        self.dropped_gradients = 0
        self.staleness_total = 0  # steps applied between a kept gradient's pull and its application
        self.staleness_max = 0
        # why a rule drops what it drops: token staleness (step at aggregation - token: what GBA's
        # decay sees) of kept and dropped gradients, and whose
        self.token_staleness_kept: Counter[int] = Counter()
        self.token_staleness_dropped: Counter[int] = Counter()
        self.applied_by_worker: Counter[int] = Counter()
        self.dropped_by_worker: Counter[int] = Counter()
        self.aborted: str | None = None  # why the epoch was abandoned (a worker failed): nobody waits

    def _guard(self):
        """The shard's lock, or none for a lock-free aggregation (its token events change nothing)."""
        return contextlib.nullcontext() if self.lock_free else self.changed

    # ---- worker verbs ---------------------------------------------------------------------------
    def submit(self, verb: Callable, *args: Any) -> Done:
        """Call ``verb`` (a method of ``ServerShard``, never a string) now (a remote shard's
        ``submit`` returns at once, and calls to several shards overlap: ``ShardRouter``)."""
        verb_of(ServerShard, verb)  # (a string, a private method or another class's: TypeError here)
        return Done(verb(self, *args))

    # A pull's ``after``: the rows (and dense parameters) of this shard once it has applied that many
    # global steps (``wait_for_step``, then the read, under one hold of the lock): a step's barrier
    # (``gates.StepBarrier``) answered with the pull, in its one round trip. None: read now.
    def pull_rows(self, keys: Tensor, after: int | None = None) -> Tensor:
        if self.lock_free and after is None:
            return self.table.pull(keys).values
        with self.changed:
            if after is not None:
                self.wait_for_step(after)
            return self.table.pull(keys).values

    def pull_with_dense(self, keys: Tensor, after: int | None = None) -> tuple[Tensor, tuple[dict[str, Tensor], int]]:
        """``pull_rows`` and ``pull_dense`` in one call (one round trip to a remote shard 0)."""
        with self.changed:
            return self.pull_rows(keys, after), self.pull_dense()

    def push_then_pull(self, gradient: Gradient, keys: Tensor, with_dense: bool, after: int | None = None):
        """A worker's deferred push and its next pull, in that order, in one call."""
        if self.lock_free and after is None:
            self.push(gradient)
            return self.pull_with_dense(keys) if with_dense else self.pull_rows(keys)
        with self.changed:
            self.push(gradient)
            return self.pull_with_dense(keys, after) if with_dense else self.pull_rows(keys, after)

    def peek_rows(self, keys: Tensor) -> Tensor:
        if self.lock_free:
            return self.table.peek(keys)
        with self.changed:
            return self.table.peek(keys)

    def pull_dense(self) -> tuple[dict[str, Tensor], int]:
        """The dense parameters and the global step they belong to."""
        assert self.dense is not None, "this shard holds no dense parameters"
        with self.changed:
            state = {name: value.detach().clone() for name, value in self.dense.state_dict().items()}
            return state, self.global_step

    def push(self, gradient: Gradient) -> None:
        if self.lock_free:
            self.aggregation.push(self, gradient)
            return
        with self.changed:
            self.aggregation.push(self, gradient)

    def drop(self, token: int, batch: int | None = None) -> None:
        with self._guard():
            self.aggregation.drop(self, token, batch)

    def close_token(self, token: int, handed_out: int) -> None:
        with self._guard():
            self.aggregation.close_token(self, token, handed_out)

    def flush(self) -> None:
        with self._guard():
            self.aggregation.flush(self)

    def wait_for_step(self, step: int) -> None:
        """Block until this shard has applied ``step`` global steps (``Aborted`` if the epoch is)."""
        with self.changed:
            self.changed.wait_for(lambda: self.global_step >= step or self.aborted is not None)
            if self.aborted is not None and self.global_step < step:
                raise Aborted(self.aborted)

    def abort(self, reason: str) -> None:
        """Release every waiter: the epoch is abandoned (a worker failed)."""
        with self.changed:
            self.aborted = reason
            self.changed.notify_all()

    def settle(self) -> None:
        """Every verb sent so far is applied: at once, here (a remote shard's one-way verbs may not be)."""

    def resume(self) -> None:
        with self._guard():
            self.aborted = None

    def set_dense_lr(self, lr: float) -> None:
        """The dense optimizer's rate for the coming epoch (``optimizer.schedule``)."""
        with self.changed:
            set_lr(self.dense_optimizer, lr)

    def stats(self) -> dict[str, float]:
        with self.counting if self.lock_free else self.changed:
            kept = max(self.applied_gradients, 1)
            return {"global_steps": self.global_step, "gradients_applied": self.applied_gradients,
                    "gradients_dropped": self.dropped_gradients,
                    "staleness_mean": self.staleness_total / kept, "staleness_max": self.staleness_max,
                    "token_staleness_mean": sum(s * n for s, n in self.token_staleness_kept.items()) / kept,
                    "token_staleness_max": max([0, *self.token_staleness_kept]),
                    "token_staleness_kept": _histogram(self.token_staleness_kept),
                    "token_staleness_dropped": _histogram(self.token_staleness_dropped),
                    "applied_by_worker": _histogram(self.applied_by_worker),
                    "dropped_by_worker": _histogram(self.dropped_by_worker),
                    "vocabulary_added": self.table.added}

    # ---- the runtime's verbs (checkpoints, evaluation, switching jobs) ---------------------------
    def get_global_step(self) -> int:
        return self.global_step

    def set_global_step(self, step: int) -> None:
        with self.changed:
            self.global_step = step

    def export_rows(self) -> tuple[Tensor, Tensor, Tensor]:
        with self.changed:
            return self.table.export_rows()

    def import_rows(self, keys: Tensor, values: Tensor, state: Tensor) -> None:
        with self.changed:
            self.table.import_rows(keys, values, state)

    def save_part(self, path: str) -> str:
        """Write this shard's rows (``table.keys/values/state``) to ``path``, fsynced; its sha256."""
        keys, values, state = self.export_rows()
        return ckpt.write_tensors(Path(path), {"table.keys": keys, "table.values": values, "table.state": state})

    def load_part(self, path: str, sha256: str) -> None:
        """Replace this shard's rows by those of a part written by ``save_part`` (verified)."""
        tensors = ckpt.read_tensors(Path(path), sha256)
        with self.changed:
            self.table.clear()
            self.table.import_rows(tensors["table.keys"], tensors["table.values"], tensors["table.state"])

    def dense_checkpoint(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        """``dense.*`` and ``dense_optimizer.*`` tensors, and the optimizer's JSON metadata."""
        with self.changed:
            tensors = {f"dense.{k}": v.detach().clone() for k, v in self.dense.state_dict().items()}
            meta: dict[str, Any] = {}
            if self.dense_optimizer is not None:
                optimizer_tensors, meta = ckpt.flatten_optimizer(self.dense_optimizer)
                tensors.update({k: v.clone() for k, v in optimizer_tensors.items()})
            return tensors, meta

    def load_dense_checkpoint(self, tensors: dict[str, Tensor], meta: dict[str, Any] | None) -> None:
        with self.changed:
            self.dense.load_state_dict({k[len("dense."):]: v for k, v in tensors.items() if k.startswith("dense.")})
            if self.dense_optimizer is not None and meta is not None:
                ckpt.restore_optimizer(self.dense_optimizer, tensors, meta)

    # ---- what the aggregation drives (called with the lock held) --------------------------------
    def apply(self, gradients: list[Gradient], normalizer: float) -> None:
        if gradients:
            self._apply_rows(gradients, normalizer)
            if self.dense is not None:
                self._apply_dense(gradients, normalizer)
            self.applied_gradients += len(gradients)
        self.global_step += 1
        self.changed.notify_all()

    def apply_unlocked(self, gradient: Gradient) -> None:
        """Hogwild: the gradient's rows stepped with no lock (racing pushes of one row may lose one
        of them), then counted as one step under ``counting``. A dense part (never under ShadowSync:
        the replicas are the trainers') is stepped under the shard's lock."""
        self._apply_rows([gradient], 1.0)
        if self.dense is not None and gradient.dense is not None:
            with self.changed:
                self._apply_dense([gradient], 1.0)
        with self.counting:
            self.record_applied(gradient)
            self.applied_gradients += 1
            self.global_step += 1

    def record_applied(self, gradient: Gradient) -> None:
        token_staleness = self.global_step - gradient.token
        self.token_staleness_kept[token_staleness] += 1
        self.applied_by_worker[gradient.worker] += 1
        if gradient.pulled_step is None:
            return
        staleness = self.global_step - gradient.pulled_step
        self.staleness_total += staleness
        self.staleness_max = max(self.staleness_max, staleness)

    def record_dropped(self, gradients: list[Gradient]) -> None:
        self.dropped_gradients += len(gradients)
        for gradient in gradients:
            self.token_staleness_dropped[self.global_step - gradient.token] += 1
            self.dropped_by_worker[gradient.worker] += 1

    def _apply_rows(self, gradients: list[Gradient], normalizer: float) -> None:
        keys = torch.cat([g.keys for g in gradients])
        if not keys.numel():
            return
        unique, inverse = torch.unique(keys, return_inverse=True)
        summed = torch.zeros(unique.shape[0], self.table.width).index_add_(
            0, inverse, torch.cat([g.rows if g.weight == 1.0 else g.rows * g.weight for g in gradients]))
        block = self.table.pull(unique)
        self.entity_optimizer.step(block.values, block.state, summed.div_(normalizer))
        self.table.set(unique, block)

    def _apply_dense(self, gradients: list[Gradient], normalizer: float) -> None:
        if self.dense_optimizer is None:  # a dense module without parameters (buffers only)
            return
        for name, parameter in self.dense.named_parameters():
            total = torch.stack([g.dense[name] * g.weight for g in gradients]).sum(0)
            parameter.grad = total.div_(normalizer)
        self.dense_optimizer.step()
        self.dense_optimizer.zero_grad(set_to_none=True)


class DenseReducer:
    """The all-reduce of dense gradients when the dense parameters live on the workers
    (``ps.dense: workers``): one round per batch each, every live worker contributes its batch's
    dense gradients, or None when it had no batch, and each gets back their sum (in worker order,
    so every replica computes the same update) and how many contributed gradients; 0 means no
    worker had a batch: the epoch is over. A worker that dies ``leave``s; ``abort`` releases all."""

    def __init__(self, workers: list[int]):
        self.live = set(workers)
        self.contributions: dict[int, dict[str, Tensor] | None] = {}
        self.result: tuple[dict[str, Tensor] | None, int] = (None, 0)
        self.round = 0
        self.aborted: str | None = None
        self.changed = threading.Condition()

    def allreduce(self, worker: int, gradients: dict[str, Tensor] | None) -> tuple[dict[str, Tensor] | None, int]:
        with self.changed:
            this = self.round
            self.contributions[worker] = gradients
            self._maybe_finish()
            self.changed.wait_for(lambda: self.round != this or self.aborted is not None)
            if self.round == this:
                raise Aborted(self.aborted)
            return self.result

    def leave(self, worker: int) -> None:
        with self.changed:
            self.live.discard(worker)
            self._maybe_finish()

    def abort(self, reason: str) -> None:
        with self.changed:
            self.aborted = reason
            self.changed.notify_all()

    def _maybe_finish(self) -> None:
        if not self.contributions or not self.live <= set(self.contributions):
            return
        given = [self.contributions[w] for w in sorted(self.contributions) if self.contributions[w] is not None]
        total = {name: torch.stack([g[name] for g in given]).sum(0) for name in given[0]} if given else None
        self.result = (total, len(given))
        self.contributions = {}
        self.round += 1
        self.changed.notify_all()


class DataList:
    """Hands out (batch position j, batch, token).

    Tokens: ``fixed``, the paper's token list: token = first_token + floor(j / M); ``fresh``
    (backup workers, hop_bw): the shards' current global step when the batch is taken. With fresh
    tokens a worker takes its next batch only once the step of its previous batch has been applied,
    so it computes at most one batch per step, and a late worker's next batch belongs to the
    current step (it is not left behind for the rest of the epoch).

    Order: ``shared``, any worker takes the next batch, so fast workers take more (async, bsp, gba,
    hop_bs, hop_bw: the paper's data list); ``per_worker``, worker i computes batches i, i + N,
    i + 2N, ...: exactly one local batch per worker per step, as synchronous training does (sync);
    the share of a dead worker is dropped.

    Shards are told when every batch of a token has been handed out or dropped (``close_token``), and
    of each drop. ``stop`` ends the hand-out at once (a worker failed).
    """

    def __init__(self, batches: list, per_token: int, first_token: int, shards: list,
                 workers: int = 1, per_worker: bool = False, fresh_tokens: bool = False):
        self.batches = batches
        self.per_token = per_token
        self.first_token = first_token
        self.shards = shards
        self.per_worker = per_worker
        self.fresh = fresh_tokens
        self.queues = [list(range(w, len(batches), workers)) for w in range(workers)] if per_worker else None
        self.next = 0
        self.settled: dict[int, int] = {}  # token -> batches handed out or dropped so far
        self.live = set(range(workers))
        self.last_token: dict[int, int] = {}  # fresh tokens: worker -> token of its last batch
        self.closed: set[int] = set()
        self.stopped = False
        self.lock = threading.Lock()

    def take(self, worker: int = 0) -> tuple[int, object, int] | None:
        if self.fresh:  # one batch per step: wait until the step of this worker's last batch is applied
            step = self.last_token.get(worker, self.first_token - 1) + 1
            for shard in self.shards:
                shard.wait_for_step(step)
        with self.lock:  # one critical section: hand-out and its accounting (closing a token) together
            if self.stopped:
                return None
            if self.per_worker:
                if not self.queues[worker]:
                    return None
                j = self.queues[worker].pop(0)
            else:
                if self.next >= len(self.batches):
                    if self.fresh:
                        self._close_current()
                    return None
                j = self.next
                self.next += 1
            if self.fresh:
                token = self.last_token[worker] = self._current_step()
            else:
                token = self.token_of(j)
            self._settle(token)
        return j, self.batches[j], token

    def abandon(self, worker: int) -> None:
        """A worker died: with per-worker queues its remaining batches are dropped; with fresh
        tokens the current step stops waiting for it."""
        with self.lock:
            self.live.discard(worker)
            remaining = []
            if self.per_worker:
                remaining, self.queues[worker] = self.queues[worker], []
            elif self.fresh:
                self._close_current()
        for j in remaining:
            token = self.token_of(j)
            for shard in self.shards:
                shard.drop(token)
            with self.lock:
                self._settle(token)

    def stop(self) -> None:
        with self.lock:
            self.stopped = True

    def token_of(self, j: int) -> int:
        return self.first_token + j // self.per_token

    def _current_step(self) -> int:
        return min(shard.get_global_step() for shard in self.shards)

    def _settle(self, token: int) -> None:
        """(lock held) One more batch of ``token`` handed out or dropped; close it when complete."""
        self.settled[token] = self.settled.get(token, 0) + 1
        if self.fresh:  # every live worker has a batch of this step
            complete = len(self.live) <= self.settled[token]
        else:
            start = (token - self.first_token) * self.per_token
            complete = self.settled[token] == min(self.per_token, len(self.batches) - start)
        if complete and token not in self.closed:
            self.closed.add(token)
            for shard in self.shards:
                shard.close_token(token, self.settled[token])

    def _close_current(self) -> None:
        """(lock held) Fresh tokens: no more batches for the current step (data ran out, or a worker
        left); close it with what was handed out."""
        if not self.settled:
            return
        token = max(self.settled)
        if token in self.closed:
            return
        if self.next < len(self.batches) and self.settled[token] < len(self.live):
            return
        self.closed.add(token)
        for shard in self.shards:
            shard.close_token(token, self.settled[token])
