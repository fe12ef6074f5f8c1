"""The pipelined family (SPEC sections 1 and 4): one process, the rows in an ``EmbeddingStore``, the
pipeline's stages (``cadence.pipeline``) scheduled by ``sync`` (``sync``), the async pipeline and
OAC (``control``, ``validation_cache``), or pdASGD's forward and backward threads (``pdasgd``);
``runtime``: the runtime the trainer drives.

The family's strategies are in ``strategy`` (imported by ``cadence.strategies.catalog``); its
settings in ``settings`` (imported by ``cadence.strategies``, so a config reads them without torch).
"""
