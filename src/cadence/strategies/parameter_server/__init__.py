"""The parameter-server family (SPEC sections 3 and 5): server shards own the rows and workers pull,
compute and push; a mode (``modes``) is a few choices over that runtime: GBA and its baselines
(``sync``, ``async``, ``bsp``, ``gba``, ``hop_bs``, ``hop_bw``) and ShadowSync and its baselines
(``shadow-*``, ``fr-*``, ``hogwild``: trainers with dense replicas, ``shadow``, ``dense_sync``).
``server``: the shard and the data list; ``worker``: the worker loop and the router;
``aggregation`` and ``gates``: the modes' rules; ``engines``: the thread engine; ``ray_engine``: the
same roles as Ray actors (imported only with ``--engine ray``); ``runtime``: the runtime the trainer
drives.

The family's strategies are in ``strategy`` (imported by ``cadence.strategies.catalog``); its
settings in ``settings`` (imported by ``cadence.strategies``, so a config reads them without torch).
"""
