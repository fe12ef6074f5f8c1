"""The parameter server's roles, written once for every strategy family built on them (SPEC
sections 3 and 5): server shards own the rows and apply a mode's aggregation (``server``,
``aggregation``), workers pull, compute and push (``worker``), a coordinator hands out batches and
tokens and holds the gate (``coordinator``, ``gates``); one epoch's protocol on the driver
(``epoch``), the engines that place the roles (``engines``: threads of this process; ``ray_engine``:
Ray actors, imported only with ``--engine ray``), the runtime the trainer drives (``runtime``), a
mode's hooks (``modes``), its entry in the strategy registry (``strategy``) and the settings,
``ps.*`` (``settings``). The families that choose among these (``cadence.strategies.
parameter_server``: GBA's; ``cadence.strategies.shadowsync``) register their modes in
``modes.PS_MODES``; nothing here names a mode.
"""
