"""AdaPM (SPEC section 2): nodes with node-local stores, intent signals, relocation or replication
decided on each key's owner, replica synchronisation with versions, Algorithm 1's action timing
(``docs/strategies/adapm.md``). A node and its protocol are ``cadence.pm``'s; here ``timing``: Algorithm 1;
``engine``: the node role and the driver's side, on any placement (``engines.placement``: threads
of this process, or Ray actors, imported only with ``--engine ray``).

The family's strategies are in ``strategy`` (imported by ``cadence.strategies.catalog``); its
settings in ``settings`` (imported by ``cadence.strategies``, so a config reads them without torch).
"""
