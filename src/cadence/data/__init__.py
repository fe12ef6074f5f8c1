"""Datasets: readers, fetchers, generators and the batch plan."""

from cadence.data.datasets import DATASETS, load_graph
from cadence.data.triples import KnowledgeGraph

__all__ = ["DATASETS", "KnowledgeGraph", "load_graph"]
