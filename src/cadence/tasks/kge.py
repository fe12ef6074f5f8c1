"""Knowledge-graph embeddings (``task: kge``): link prediction with DistMult, ComplEx, TransE, RotatE.

Rows: one per entity (a fixed table). Dense module: ``KgeModel`` (the relation parameters). A batch
is a slice of the shuffled training triples plus ``train.negatives`` negative entities, shared by the
batch or drawn per chunk of ``train.negative_chunk`` edges (``auto``: by the loss, ``negative_chunk``),
sampled from the batch's own generator (seed, epoch, index); with ``train.scoring: all`` it touches
every entity. Evaluation: filtered MRR and Hits@k, both directions (primary metric ``mrr``).
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import Tensor, nn

from cadence.config import Config, TrainConfig
from cadence.kernels import RowStep
from cadence.data.datasets import load_graph
from cadence.data.triples import KnowledgeGraph, with_reciprocals, write_id_maps
from cadence.resources import check_memory
from cadence.errors import ConfigError
from cadence.evaluation.ranking import FilteredRankingMetric, summarize_ranks
from cadence.models.kge import KgeModel
from cadence.models.scorers import SCORERS
from cadence.prediction.kge import KgePredictor
from cadence.core.batch import Batch, BatchPlan, plan_epoch
from cadence.core.rows import RowBlock
from cadence.seeding import derive_seed
from cadence.tasks.base import TASKS, ParameterView, Progress, TableSpec, Task, Vocabulary, write_vectors_tsv

WHOLE_TABLE_FLOATS = 1 << 26  # evaluation reads an entity table of up to 256 MiB whole ...
ENTITY_BLOCK_FLOATS = 1 << 22  # ... a larger one 16 MiB of rows at a time (where the rows live, a
# block's reads are a passing allocation: small ones fit beside a node's rows under a memory cap)


def negative_chunk(train: TrainConfig) -> int:
    """``train.negative_chunk`` as a number. ``auto``: the layout that reaches a quality soonest for the
    loss (measured: docs/tasks/kge.md): chunks of ``train.negatives`` edges, each drawing its own
    negatives (PyTorch-BigGraph's layout), under softmax; 0, shared by the batch, under logistic (and
    with ``train.scoring: all``, which samples none)."""
    if train.negative_chunk != "auto":
        return train.negative_chunk
    return 0 if train.scoring == "all" or train.loss == "logistic" else train.negatives


def negative_pool(train: TrainConfig) -> str:
    """``train.negative_pool`` as a pool. ``auto``: the one that reached the better quality for the
    loss (measured: docs/tasks/kge.md): the entities on a training edge under logistic, every entity
    under softmax."""
    if train.negative_pool != "auto":
        return train.negative_pool
    return "edges" if train.loss == "logistic" else "all"


@TASKS.register("kge")
class KgeTask(Task):
    name = "kge"
    primary_metric = "mrr"
    own_keys = ("train.scoring", "train.negatives", "train.negative_chunk", "train.negative_pool", "train.loss", "train.reciprocal", "train.regularizer",
                "train.reg_weight", "eval.max_triples", "eval.negatives", "data.synthetic")

    def __init__(self, config: Config, graph: KnowledgeGraph | None = None):
        super().__init__(config)
        self.data_given = graph is not None
        SCORERS.get(config.model.name)(config.model)  # validates the name, dim parity and options
        self.graph = graph if graph is not None else load_graph(config.data, config.seed)
        self.num_relations = self.graph.num_relations * (2 if config.train.reciprocal else 1)
        self.train_triples = (with_reciprocals(self.graph.train, self.graph.num_relations)
                              if config.train.reciprocal else self.graph.train)
        self.negatives = None if config.train.scoring == "all" else config.train.negatives
        self.negative_chunk = negative_chunk(config.train)  # (a config from api.prepare_config: as given)
        self.negative_pool = self._negative_pool()
        # a batch's candidates (their rows, and a score per query and candidate, both sides), known now
        candidates = self.graph.num_entities if self.negatives is None else self.negatives
        check_memory(f"model.dim {config.model.dim:,} with "
                     f"{'train.scoring: all' if self.negatives is None else f'train.negatives {candidates:,}'} "
                     f"and train.batch_size {config.train.batch_size:,}: a batch's candidate rows and scores",
                     2 * 4 * candidates * (config.model.dim + config.train.batch_size))
        # a reciprocal run trains each edge twice per epoch; examples count edges, not copies
        self.copies_per_edge = self.train_triples.shape[0] // max(1, self.graph.train.shape[0])

    def _negative_pool(self) -> Tensor | None:
        """The sorted ids sampled negatives are drawn from (``train.negative_pool: edges``: the entities
        on a training edge), or None: every entity (``all``, or a graph whose every entity is on one:
        the draws are then exactly those of ``all``)."""
        if self.negatives is None or negative_pool(self.config.train) == "all":
            return None
        on_edges = torch.unique(self.graph.train[:, [0, 2]])
        return None if on_edges.shape[0] == self.graph.num_entities else on_edges

    @classmethod
    def resolve_defaults(cls, config: Config, node_parts: tuple[int, int] = (1, 1)) -> None:
        config.train.negative_chunk = negative_chunk(config.train)
        config.train.negative_pool = negative_pool(config.train)

    @property
    def dataset_name(self) -> str:
        return self.graph.name

    def data_parts(self) -> dict[str, tuple]:
        graph = self.graph
        return {"entity ids": (graph.num_entities, graph.entity_names),
                "relation ids": (graph.num_relations, graph.relation_names),
                "train split": (graph.train,), "valid split": (graph.valid,), "test split": (graph.test,)}

    def table(self) -> TableSpec:
        return TableSpec(self.graph.num_entities, self.config.model.dim, self.config.model.init_std,
                         derive_seed(self.config.seed, "entities"))

    def build_dense(self) -> nn.Module:
        frozen = self.frozen.dense_rows.get("relations") if self.frozen is not None else None
        return KgeModel(self.config, self.num_relations, frozen)

    def vocabulary(self) -> Vocabulary:
        """Entities by name (by id in a graph without names); relation rows by name, a reciprocal
        run's inverse of *r* as ``r^-1``."""
        entities, relations = self._names()
        return Vocabulary({"entities": tuple(map(str, entities))}, {"relations": tuple(map(str, relations))})

    def keeping(self, kept: Vocabulary, keys: Tensor) -> "KgeTask":
        """Kept entities and relations appended to the graph's (a kept relation's inverse row, of a
        reciprocal run, comes with it)."""
        graph = self.graph
        entities = [*map(str, graph.entity_names or range(graph.num_entities)), *kept.parts.get("entities", ())]
        old = kept.dense.get("relations", ())
        relations = [*map(str, graph.relation_names or range(graph.num_relations)),
                     *(name for name in old if not (name.endswith("^-1") and name[:-3] in old))]
        grown = dataclasses.replace(graph, num_entities=len(entities), entity_names=entities,
                                    num_relations=len(relations), relation_names=relations)
        return KgeTask(self.config, grown)

    def _names(self) -> tuple[Sequence, list]:
        """(entity names, the name of each row of the relation parameters)."""
        graph = self.graph
        relations = list(graph.relation_names or range(graph.num_relations))
        if self.config.train.reciprocal:
            relations += [f"{name}^-1" for name in relations]
        return graph.entity_names or range(graph.num_entities), relations

    # ---- batches --------------------------------------------------------------------------------
    def plan(self, epoch: int) -> list[BatchPlan]:
        return plan_epoch(self.train_triples.shape[0], self.config.train.batch_size, self.config.seed, epoch)

    def prepare(self, plan: BatchPlan) -> Batch:
        heads, relations, tails = self.train_triples.index_select(0, plan.examples).unbind(1)
        num_entities = self.graph.num_entities
        if self.negatives is None:
            return Batch(plan, torch.arange(num_entities), {"heads": heads, "relations": relations, "tails": tails})
        size = plan.size
        chunk = self.negative_chunk or size
        chunks = -(-size // chunk)  # each chunk of edges draws its own negatives; one: the batch shares them
        pool = self.negative_pool
        sampled = torch.randint(num_entities if pool is None else pool.shape[0], (chunks * self.negatives,),
                                generator=plan.generator(self.config.seed))
        if pool is not None:
            sampled = pool.index_select(0, sampled)
        ids, local = torch.unique(torch.cat([heads, tails, sampled]), return_inverse=True)
        # the heads, the tails, then the candidates, as positions in the batch's rows: one gather
        return Batch(plan, ids, {"positions": local, "relations": relations})

    def edge_positions(self, batch: Batch) -> dict[str, Tensor | None]:
        """A batch's edges and sampled negatives as positions in its rows: ``heads``, ``tails`` and
        ``relations`` [B]; ``candidates`` [C] shared by the batch, [K, n] (chunk k of ceil(B / K)
        edges against row k), or None (every entity is a candidate)."""
        inputs = batch.inputs
        if "positions" not in inputs:
            return {**inputs, "candidates": None}
        size, positions = inputs["relations"].shape[0], inputs["positions"]
        candidates = positions[2 * size:]
        chunks = candidates.shape[0] // self.config.train.negatives
        return {"heads": positions[:size], "relations": inputs["relations"], "tails": positions[size:2 * size],
                "candidates": candidates if chunks == 1 else candidates.view(chunks, -1)}

    def loss(self, batch: Batch, rows: Tensor, dense: nn.Module) -> Tensor:
        inputs = batch.inputs
        if "positions" in inputs:
            return dense.loss_at(rows, inputs["positions"], inputs["relations"])
        return dense.loss(rows, inputs["heads"], inputs["relations"], inputs["tails"], None)

    def fused_step(self, batch: Batch, rows: RowBlock, dense: nn.Module, step: RowStep):
        inputs = batch.inputs
        if batch.frozen is not None or "positions" not in inputs:
            return None
        return dense.fused_step(rows.values, rows.state, inputs["positions"], inputs["relations"], step)

    def examples_of(self, triples_seen: int) -> int:
        return triples_seen // self.copies_per_edge

    # ---- evaluation -----------------------------------------------------------------------------
    def split_size(self, split: str) -> int | None:
        return int(self.graph.split(split).shape[0]) if split in ("train", "valid", "test") else None

    def evaluate(self, params: ParameterView, dense: nn.Module, split: str, device: torch.device,
                 progress: Progress) -> dict[str, float]:
        if split not in ("train", "valid", "test"):
            raise ConfigError(f"split must be train, valid or test, got {split!r}")
        triples = self.graph.split(split)
        limit = self.config.eval.max_triples
        if limit and triples.shape[0] > limit:
            generator = torch.Generator().manual_seed(derive_seed(self.config.seed, "eval-subset", split))
            triples = triples[torch.randperm(triples.shape[0], generator=generator)[:limit]]
        if not hasattr(self, "_cache_metric"):
            self._cache_metric = FilteredRankingMetric(self.graph, self.config.train.reciprocal)
        metric, count = self._cache_metric, self.graph.num_entities
        block = max(1, ENTITY_BLOCK_FLOATS // self.table().width)
        dense.eval()
        try:
            if self.config.eval.negatives:  # against a fixed sample of entities, labelled as such
                candidates = self.eval_candidates(split)
                ranks = metric.ranks_in_blocks(dense, lambda ids: params.values(ids).to(device), candidates,
                                               triples.to(device), block, progress)
                return {**summarize_ranks(ranks), "eval_candidates": int(candidates.shape[0])}
            if count * self.table().width <= WHOLE_TABLE_FLOATS:  # the entity table, whole, in this process
                return metric(dense, params.values(torch.arange(count)).to(device), triples.to(device), progress)
            # a larger table is read a block at a time from wherever its rows live (an AdaPM run's
            # nodes, a parameter server's shards): this process never holds it whole
            ranks = metric.ranks_in_blocks(dense, lambda ids: params.values(ids).to(device), count,
                                           triples.to(device), block, progress)
            return summarize_ranks(ranks)
        finally:
            dense.train()

    def eval_candidates(self, split: str) -> Tensor:
        """``eval.negatives`` distinct entities (every entity where there are fewer), drawn from the
        run's seed and the split alone: every evaluation of the split ranks against the same ones."""
        count, wanted = self.graph.num_entities, self.config.eval.negatives
        if wanted >= count:
            return torch.arange(count)
        cache = self.__dict__.setdefault("_cache_candidates", {})
        if split not in cache:
            generator = torch.Generator().manual_seed(derive_seed(self.config.seed, "eval-negatives", split))
            cache[split] = torch.randperm(count, generator=generator)[:wanted].sort().values
        return cache[split]

    # ---- prediction ------------------------------------------------------------------------------
    predictor_type = KgePredictor

    def predictor(self, params: ParameterView, dense: nn.Module) -> KgePredictor:
        return KgePredictor(self.config, self.graph, dense, params, self.config.train.reciprocal)

    # ---- outputs --------------------------------------------------------------------------------
    def write_metadata(self, run_dir: Path) -> None:
        write_id_maps(self.graph, run_dir)

    def export(self, params: ParameterView, dense: nn.Module, run_dir: Path, out: Path, format: str) -> list[Path]:
        """``npy``: ``entity_embeddings.npy`` [entities, dim], ``relation_embeddings.npy`` and the id maps;
        ``tsv``: ``entities.tsv`` and ``relations.tsv`` (name, then the row; a reciprocal run's inverse
        relation *r* is ``r^-1``; a graph without names is named by id)."""
        entities = params.values(torch.arange(self.graph.num_entities))
        if format == "tsv":
            entity_names, relation_names = self._names()
            return [write_vectors_tsv(out / "entities.tsv", entity_names, entities),
                    write_vectors_tsv(out / "relations.tsv", relation_names, dense.relations)]
        written = []
        for name, value in (("entity_embeddings.npy", entities), ("relation_embeddings.npy", dense.relations)):
            np.save(out / name, value.detach().cpu().numpy())
            written.append(out / name)
        for name in ("entity_ids.tsv", "relation_ids.tsv"):
            if (run_dir / name).exists():
                shutil.copyfile(run_dir / name, out / name)
                written.append(out / name)
        return written
