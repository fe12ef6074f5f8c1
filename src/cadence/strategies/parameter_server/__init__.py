"""GBA and its baselines (SPEC section 3) on the parameter server's roles (``cadence.ps``: server
shards own the rows, workers pull, compute and push, a coordinator hands out batches; threads or
Ray actors): ``sync``, ``async``, ``bsp``, ``gba``, ``hop_bs``, ``hop_bw``, each a few choices over
those roles (``modes``). Its strategies are in ``strategy`` (imported by
``cadence.strategies.catalog``); its settings, ``ps.*``, are the roles' own (``cadence.ps.settings``).
"""
