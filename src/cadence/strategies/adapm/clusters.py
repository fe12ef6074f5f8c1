"""Where AdaPM's nodes run, by ``ps.engine``: ``threads`` (every node in this process: ``engine``)
or ``ray`` (one node per Ray actor: ``ray_nodes``, imported only when a run uses it)."""

from __future__ import annotations

from typing import Any

from torch import nn

from cadence.config import Config
from cadence.registry import Registry
from cadence.strategies.adapm.engine import Cluster

CLUSTERS: Registry[Any] = Registry("engine", "ps.engine")
CLUSTERS.register("threads")(Cluster)


@CLUSTERS.register("ray")
def ray_cluster(config: Config, task, dense: nn.Module):
    """One node per Ray actor; Ray is imported here, when the engine is used."""
    from cadence.strategies.adapm.ray_nodes import RayCluster

    return RayCluster(config, task, dense)
