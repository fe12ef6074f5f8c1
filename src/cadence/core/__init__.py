"""The types and helpers every layer shares: batches (``batch``), key indexes (``keys``), the
runtime contract (``runtime``) and checkpoint I/O (``checkpoint``). Below everything but the
foundation modules (``errors``, ``registry``, ``seeding``, ``config``, ``device``, ``optim``)."""
