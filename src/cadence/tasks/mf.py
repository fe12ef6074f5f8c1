"""Matrix factorisation (``task: mf``): biased MF on explicit ratings (Koren, Bell, Volinsky 2009,
"Matrix Factorization Techniques for Recommender Systems", eq. 4-5; Surprise's ``SVD``).

    prediction(u, i) = mu + b_u + b_i + <p_u, q_i>
    loss = mean over the batch of (r - prediction)^2 + mf.reg (|p_u|^2 + |q_i|^2 + b_u^2 + b_i^2)

Rows: one key space of ``users + items`` rows of ``dim + 1`` floats ``[factors | bias]``: users
take keys 0..U-1, items U..U+I-1 (``TablePart``\\ s ``users`` and ``items``). Dense module: the
global mean ``mu`` of the training ratings (a buffer: it is not learned, as in Surprise). Metrics:
RMSE (primary, lower is better) and MAE, predictions clipped to the training ratings' range (as
Surprise clips to its rating scale).

Data (``data.dataset``): ``ml-100k`` (MovieLens-100k from the pinned recbole wheel), a user's file
(``user<TAB>item<TAB>rating[<TAB>timestamp]``) or ``synthetic-zipf`` (``mf.synthetic.*``).
Splits: random 80/10/10 by seed, or fold ``mf.fold`` of a ``mf.folds``-fold protocol.

Updates (``mf.update``): ``batch`` (the default) returns the batch loss above and the runtime
applies its gradient with the entity optimizer, under every strategy. ``rating`` is Surprise's
``SVD`` loop (``compiled.biased_mf_in_place``): the batch's ratings are split among the threads and
each rating's SGD step of size ``optimizer.lr`` (on half its loss, as Surprise) is applied to the rows
in place at once (Hogwild between threads); ``sync`` and ``async`` on one process, the CPU, the
``sgd`` entity optimizer.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from cadence import compiled
from cadence.config import Config
from cadence.data.ratings import RatingDataset, Ratings, load_rating_dataset
from cadence.errors import ConfigError
from cadence.models.mf import GlobalMean, predicted_ratings
from cadence.prediction.ratings import MfPredictor
from cadence.core.batch import Batch, BatchPlan, plan_epoch, unique_keys
from cadence.seeding import derive_seed
from cadence.tasks.base import (TASKS, ParameterView, Progress, TablePart, TableSpec, Task, Vocabulary, in_place_key,
                                write_vectors_tsv)

EVAL_BATCH = 65536


class BiasedMfLoss(torch.autograd.Function):
    """The batch loss with its gradient written out (autograd through slices of the [n, dim + 1]
    rows allocates and fills several full-size gradients per batch; this is one pass per side):

        e_b = r_b - (mu + <p_u, q_i> + b_u + b_i)
        loss = mean_b (e_b^2 + reg (|u|^2 + |i|^2))      u = [p_u | b_u], i = [q_i | b_i]
        d loss / d u = (-2 e_b [q_i | 1] + 2 reg u) / B, and the same for i with [p_u | 1].

    ``tests/tasks/test_mf.py`` checks it against autograd through the plain formula."""

    @staticmethod
    def forward(ctx, rows: Tensor, users: Tensor, items: Tensor, ratings: Tensor, mean: Tensor, reg: float):
        user, item = rows.index_select(0, users), rows.index_select(0, items)
        product = user * item
        dot = product.sum(1) - product[:, -1]
        error = ratings - (mean + dot + user[:, -1] + item[:, -1])
        penalty = user.square().sum(1) + item.square().sum(1)
        ctx.save_for_backward(user, item, error, users, items)
        ctx.reg, ctx.rows = reg, rows.shape[0]
        return (error.square() + reg * penalty).mean()

    @staticmethod
    def backward(ctx, grad: Tensor):
        user, item, error, users, items = ctx.saved_tensors
        scale = grad / error.shape[0]
        residual = (-2 * scale * error).unsqueeze(1)
        decay = 2 * scale * ctx.reg
        item_tilde, user_tilde = item.clone(), user.clone()
        item_tilde[:, -1], user_tilde[:, -1] = 1.0, 1.0
        grad_user = torch.addcmul(user * decay, residual, item_tilde)
        grad_item = torch.addcmul(item * decay, residual, user_tilde)
        rows = torch.zeros(ctx.rows, user.shape[1], dtype=user.dtype, device=user.device)
        rows.index_add_(0, users, grad_user).index_add_(0, items, grad_item)
        return rows, None, None, None, None, None


class CompiledBiasedMfLoss(compiled.KernelLoss):
    """``BiasedMfLoss`` in one compiled pass over the batch (``cadence.compiled``): the forward
    computes the loss and its gradient together, the backward scales the gradient. 11x faster than
    the torch ops on 2,048 ratings of 101 floats, where each op is a pass over memory."""

    @staticmethod
    def forward(ctx, rows: Tensor, users: Tensor, items: Tensor, ratings: Tensor, mean: Tensor, reg: float):
        return compiled.KernelLoss.keep(ctx, rows, *compiled.biased_mf_loss_and_gradient(
            rows, users, items, ratings, float(mean), reg))


def grid_blocks(mf, node_parts: tuple[int, int] = (1, 1)) -> tuple[int, int]:
    """``mf.row_blocks`` and ``mf.column_blocks`` as numbers. ``auto``: the paper's App. C partitioning
    where a strategy's nodes each train their own part with the rows they hold (``node_parts``:
    nodes, worker threads a node; more than one node, and no ``mf.strata``): a row block a node, a
    column block a worker thread; else off (0 row blocks, 1 column block)."""
    nodes, threads = node_parts
    rows = mf.row_blocks
    if rows == "auto":
        rows = nodes if nodes > 1 and not mf.strata else 0
    columns = mf.column_blocks
    if columns == "auto":
        columns = threads if rows and threads > 1 else 1
    return rows, columns


@TASKS.register("mf")
class MfTask(Task):
    name = "mf"
    primary_metric = "rmse"
    higher_is_better = False
    own_keys = ("mf",)

    def __init__(self, config: Config, dataset: RatingDataset | None = None):
        super().__init__(config)
        self.data_given = dataset is not None
        if config.model.name != "biased":
            raise ConfigError(f"model.name: the mf task has one model, biased; got {config.model.name!r}")
        # (a config from api.prepare_config: as given; else auto is off)
        self.row_blocks, self.column_blocks = grid_blocks(config.mf)
        if self.row_blocks and config.mf.strata:
            raise ConfigError("mf.row_blocks and mf.strata are two partitionings of the ratings; set one "
                              f"(got {self.row_blocks} and {config.mf.strata})")
        if config.mf.visit == "by-column" and not self.row_blocks:
            raise ConfigError("mf.visit: by-column orders the ratings of each of AdaPM's App. C blocks; it needs "
                              "mf.row_blocks > 0 (the default under --strategy adapm with more than one node)")
        self.dataset = dataset if dataset is not None else load_rating_dataset(
            config.data.dataset, config.seed, config.mf.synthetic, strict=config.data.strict)
        most = min(self.dataset.num_users, self.dataset.num_items)
        if config.mf.strata > most:  # (a block of no user or no item: P x P cells an epoch, nearly all empty)
            raise ConfigError(f"mf.strata {config.mf.strata:,} is more blocks than the data has users "
                              f"({self.dataset.num_users:,}) or items ({self.dataset.num_items:,}): at most {most:,}")
        if config.mf.split == "random":
            parts = self.dataset.random_split(config.seed)
        else:
            parts = self.dataset.folds(config.mf.folds, config.mf.fold, config.seed)
        self.splits: dict[str, Ratings] = dict(zip(("train", "valid", "test"), parts))
        if not len(self.splits["train"]):
            raise ConfigError(f"{self.dataset.name}: the training split is empty")
        # the kernels' first calls (loading their machine code) outside the epochs
        compiled.warm_up(*(("biased_mf_in_place",) if self.updates_in_place else
                           ("unique_keys", *(("biased_mf",) if config.train.compiled else ()))))
        train = self.splits["train"].values
        self.mean, self.low, self.high = float(train.double().mean()), float(train.min()), float(train.max())

    update_choice = ("mf.update", "rating")

    @classmethod
    def resolve_defaults(cls, config: Config, node_parts: tuple[int, int] = (1, 1)) -> None:
        config.mf.row_blocks, config.mf.column_blocks = grid_blocks(config.mf, node_parts)

    @classmethod
    def in_place_setting(cls, config: Config) -> str | None:
        if config.mf.update != "rating":
            return None
        return in_place_key(config, "mf.update", "the per-rating updates (rating)", "adagrad")

    @property
    def dataset_name(self) -> str:
        return self.dataset.name

    def data_parts(self) -> dict[str, tuple]:
        ratings = self.dataset.ratings
        return {"user ids": (self.dataset.user_ids,), "item ids": (self.dataset.item_ids,),
                "ratings": (ratings.users, ratings.items, ratings.values, ratings.timestamps)}

    def table(self) -> TableSpec:
        users, items = self.dataset.num_users, self.dataset.num_items
        return TableSpec(users + items, self.config.model.dim + 1, self.config.model.init_std,
                         derive_seed(self.config.seed, "mf-table"),
                         (TablePart("users", 0, users), TablePart("items", users, items)))

    def build_dense(self) -> nn.Module:
        return GlobalMean(self.mean, self.low, self.high)

    def keeping(self, kept: Vocabulary, keys: Tensor) -> "MfTask":
        """Kept users appended to the users, kept items to the items (an item's key moves with the
        user count, as any run's)."""
        data = self.dataset
        grown = dataclasses.replace(data, user_ids=[*data.user_ids, *kept.parts.get("users", ())],
                                    item_ids=[*data.item_ids, *kept.parts.get("items", ())])
        return MfTask(self.config, grown)

    def vocabulary(self) -> Vocabulary:
        """Users, then items, by their raw ids (each row a factor vector and a bias)."""
        return Vocabulary({"users": tuple(map(str, self.dataset.user_ids)), "items": tuple(map(str, self.dataset.item_ids))})

    # ---- batches --------------------------------------------------------------------------------
    def plan(self, epoch: int) -> list[BatchPlan]:
        strata, rows = self.config.mf.strata, self.row_blocks
        if rows:
            return self._plan_grid(epoch, rows, self.column_blocks)
        if not strata:
            return plan_epoch(len(self.splits["train"]), self.config.train.batch_size, self.config.seed, epoch,
                              "mf-shuffle")
        return self._plan_strata(epoch, strata)

    def _plan_grid(self, epoch: int, rows: int, columns: int) -> list[BatchPlan]:
        """``mf.row_blocks`` = R, ``mf.column_blocks`` = C (AdaPM's App. C): cell (r, c) holds the
        ratings of user block r and item block c, shuffled (``mf.visit: by-column``: then ordered by
        column, the columns in this epoch's random order) and batched; part r * C + c; the cells'
        batches interleaved, so every cell trains at once (every rating once)."""
        train = self.splits["train"]
        user_block = train.users * rows // self.dataset.num_users
        item_block = train.items * columns // self.dataset.num_items
        generator = torch.Generator().manual_seed(derive_seed(self.config.seed, "mf-grid", epoch))
        cells = []
        # by-column: each item's place in this epoch's random order of the columns
        rank = (torch.randperm(self.dataset.num_items, generator=generator).argsort()
                if self.config.mf.visit == "by-column" else None)
        for row in range(rows):
            for column in range(columns):
                cell = ((user_block == row) & (item_block == column)).nonzero().squeeze(1)
                cell = cell[torch.randperm(cell.shape[0], generator=generator)]
                if rank is not None:  # (a stable sort keeps a column's ratings shuffled)
                    cell = cell[torch.argsort(rank[train.items[cell]], stable=True)]
                cells.append(cell.split(self.config.train.batch_size))
        return self._interleave(epoch, [cells], [])

    @staticmethod
    def _interleave(epoch: int, rounds: list[list], plans: list[BatchPlan]) -> list[BatchPlan]:
        """Each round's cells' batches, position by position (part = the cell's index); an empty
        cell's (one empty batch) is no batch."""
        for cells in rounds:
            for position in range(max((len(cell) for cell in cells), default=0)):
                for part, cell in enumerate(cells):
                    if position < len(cell) and cell[position].numel():
                        plans.append(BatchPlan(epoch, len(plans), cell[position], part))
        return plans

    def _plan_strata(self, epoch: int, parts: int) -> list[BatchPlan]:
        """``mf.strata`` = P: sub-epoch s, part p: the ratings of user block p and item block
        (p + s) mod P, shuffled and batched; the parts' batches interleaved (every rating once)."""
        train, batch_size = self.splits["train"], self.config.train.batch_size
        user_block = train.users * parts // self.dataset.num_users
        item_block = train.items * parts // self.dataset.num_items
        generator = torch.Generator().manual_seed(derive_seed(self.config.seed, "mf-strata", epoch))
        # every rating's cell (sub-epoch s, part p) at once: one sort, not a scan of the ratings per cell
        cell_of = (item_block - user_block) % parts * parts + user_block
        order = torch.argsort(cell_of, stable=True)
        cells = order.split(torch.bincount(cell_of, minlength=parts * parts).tolist())
        rounds = [[cell[torch.randperm(cell.shape[0], generator=generator)].split(batch_size)
                   for cell in cells[step * parts:(step + 1) * parts]] for step in range(parts)]
        return self._interleave(epoch, rounds, [])

    def partition(self, plans: list[BatchPlan], parts: int) -> list[list[BatchPlan]]:
        """With ``mf.strata`` equal to the number of parts, part p trains its own strata; with
        ``mf.row_blocks`` equal to it, part r trains row block r (every column of it)."""
        rows, columns = self.row_blocks, self.column_blocks
        if rows and rows == parts:
            return [[plan for plan in plans if plan.part // columns == row] for row in range(rows)]
        if rows or self.config.mf.strata != parts:
            return super().partition(plans, parts)
        return [[plan for plan in plans if plan.part == part] for part in range(parts)]

    def partition_workers(self, plans: list[BatchPlan], workers: int) -> list[list[BatchPlan]]:
        """With ``mf.column_blocks`` equal to a node's worker threads, worker c trains column block c
        of the node's row block."""
        columns = self.column_blocks
        if not self.row_blocks or columns != workers:
            return super().partition_workers(plans, workers)
        return [[plan for plan in plans if plan.part % columns == column] for column in range(columns)]

    def prepare(self, plan: BatchPlan) -> Batch:
        if self.updates_in_place:  # the kernel reads the ratings by position (``step_in_place``)
            return Batch(plan, torch.empty(0, dtype=torch.int64))
        train, index = self.splits["train"], plan.examples
        users, items = train.users.index_select(0, index), train.items.index_select(0, index)
        keys = torch.cat([users, items + self.dataset.num_users])
        ids, local = unique_keys(keys, self.dataset.num_users + self.dataset.num_items)
        size = index.shape[0]
        return Batch(plan, ids, {"users": local[:size], "items": local[size:],
                                 "ratings": train.values.index_select(0, index)})

    def loss(self, batch: Batch, rows: Tensor, dense: nn.Module) -> Tensor:
        inputs = batch.inputs
        kind = CompiledBiasedMfLoss if self.config.train.compiled and compiled.usable(rows) else BiasedMfLoss
        return kind.apply(rows, inputs["users"], inputs["items"], inputs["ratings"], dense.mean,
                                  self.config.mf.reg)

    def step_in_place(self, batch: Batch, values: Tensor, piece: int, pieces: int) -> float:
        """Surprise's SGD over this piece's share of the batch's ratings (a contiguous slice of the
        shuffled positions), in place on ``values`` (``compiled.biased_mf_in_place``); returns the
        piece's summed loss over the batch's size (the pieces sum to the batch's mean)."""
        train, examples = self.splits["train"], batch.plan.examples
        size = examples.shape[0]
        mine = examples[piece * size // pieces:(piece + 1) * size // pieces]
        total = compiled.biased_mf_in_place(values, train.users.index_select(0, mine),
                                            train.items.index_select(0, mine) + self.dataset.num_users,
                                            train.values.index_select(0, mine), self.mean, self.config.mf.reg,
                                            self.config.optimizer.lr)
        return total / max(1, size)

    # ---- evaluation -----------------------------------------------------------------------------
    @torch.no_grad()
    def split_size(self, split: str) -> int | None:
        return len(self.splits[split]) if split in self.splits else None

    def evaluate(self, params: ParameterView, dense: nn.Module, split: str, device: torch.device,
                 progress: Progress) -> dict[str, float]:
        if split not in self.splits:
            raise ConfigError(f"split must be train, valid or test, got {split!r}")
        ratings = self.splits[split]
        squared, absolute = 0.0, 0.0
        for start in progress(range(0, len(ratings), EVAL_BATCH)):
            part = ratings.subset(torch.arange(start, min(start + EVAL_BATCH, len(ratings))))
            user = params.values(part.users).to(device)
            item = params.values(part.items + self.dataset.num_users).to(device)
            error = part.values.to(device) - predicted_ratings(user, item, dense)
            squared += float(error.double().square().sum())
            absolute += float(error.double().abs().sum())
        count = max(1, len(ratings))
        return {"rmse": (squared / count) ** 0.5, "mae": absolute / count}

    # ---- prediction ------------------------------------------------------------------------------
    predictor_type = MfPredictor

    def predictor(self, params: ParameterView, dense: nn.Module) -> MfPredictor:
        data = self.dataset
        return MfPredictor(self.config, data.user_ids, data.item_ids, params, dense, self.splits["train"])

    # ---- outputs --------------------------------------------------------------------------------
    def write_metadata(self, run_dir: Path) -> None:
        self.dataset.write_id_maps(run_dir)

    def export(self, params: ParameterView, dense: nn.Module, run_dir: Path, out: Path, format: str) -> list[Path]:
        """``npy``: ``user_factors.npy`` [U, dim], ``user_biases.npy`` [U], ``item_factors.npy`` [I, dim],
        ``item_biases.npy`` [I], ``global_mean.npy`` (scalar), and the id maps. ``tsv``: ``users.tsv`` and
        ``items.tsv`` (raw id, then the factors), ``user_biases.tsv`` and ``item_biases.tsv`` (raw id,
        bias), ``global_mean.txt``."""
        users, items = self.dataset.num_users, self.dataset.num_items
        user_rows = params.values(torch.arange(users))
        item_rows = params.values(torch.arange(users, users + items))
        if format == "tsv":
            user_ids, item_ids = self.dataset.user_ids, self.dataset.item_ids
            (out / "global_mean.txt").write_text(f"{float(dense.mean):.9g}\n")
            return [write_vectors_tsv(out / "users.tsv", user_ids, user_rows[:, :-1]),
                    write_vectors_tsv(out / "items.tsv", item_ids, item_rows[:, :-1]),
                    write_vectors_tsv(out / "user_biases.tsv", user_ids, user_rows[:, -1:]),
                    write_vectors_tsv(out / "item_biases.tsv", item_ids, item_rows[:, -1:]), out / "global_mean.txt"]
        files = {"user_factors.npy": user_rows[:, :-1], "user_biases.npy": user_rows[:, -1],
                 "item_factors.npy": item_rows[:, :-1], "item_biases.npy": item_rows[:, -1],
                 "global_mean.npy": dense.mean}
        for name, value in files.items():
            np.save(out / name, value.detach().cpu().numpy())
        self.dataset.write_id_maps(out)
        return [out / name for name in files] + [out / "user_ids.tsv", out / "item_ids.tsv"]
