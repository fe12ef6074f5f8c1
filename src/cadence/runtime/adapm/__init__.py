"""AdaPM (SPEC section 2): nodes with node-local stores, intent signals, relocation or replication
decided on each key's owner, replica synchronisation with versions, Algorithm 1's action timing
(``docs/strategies/adapm.md``). ``node``: one node and the protocol; ``timing``: Algorithm 1;
``engine``: the nodes of one process; ``ray_nodes``: nodes as Ray actors (imported only with
``--engine ray``)."""
