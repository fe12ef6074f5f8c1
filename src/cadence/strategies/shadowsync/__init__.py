"""ShadowSync and its baselines (SPEC section 5) on the parameter server's roles (``cadence.ps``):
``ps.workers`` trainers, each a dense replica trained Hogwild by ``shadow.threads`` worker threads,
the embeddings Hogwild on the server shards. ``modes``: the strategies (``shadow-*``, ``fr-*``,
``hogwild``) and how their trainers start on each engine; ``trainer``: one trainer and its threads;
``dense_sync``: the sync rules (EASGD, MA, BMUF), the shadow thread and the foreground gate;
``on_ray``: the trainers as jobs of Ray worker actors (imported only with ``--engine ray``).

The family's strategies are in ``strategy`` (imported by ``cadence.strategies.catalog``); its
settings, ``shadow.*``, in ``settings`` (imported by ``cadence.strategies``, so a config reads them
without torch).
"""
