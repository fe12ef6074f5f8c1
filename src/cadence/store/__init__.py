"""Embedding storage: rows, their optimizer state and their versions."""

from cadence.core.rows import RowBlock
from cadence.store.embedding_store import STORE_BACKENDS, EmbeddingStore, create_store

__all__ = ["STORE_BACKENDS", "EmbeddingStore", "RowBlock", "create_store"]
