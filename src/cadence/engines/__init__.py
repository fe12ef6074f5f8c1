"""Where code runs: threads of this process (``threads``), Ray actors (``ray``, imported only when a
run uses it), the roles of a protocol placed on either (``placement``, chosen by ``PLACEMENTS``) and
the direct channel between processes (``channel``). Nothing here names a strategy."""

from __future__ import annotations

from typing import Any

from cadence.engines.placement import InProcess, Placement
from cadence.registry import Registry

PLACEMENTS: Registry[Any] = Registry("engine", "ps.engine")
PLACEMENTS.register("threads")(InProcess)


@PLACEMENTS.register("ray")
def ray_placement(address: str | None, threads: int) -> Placement:
    """One actor per role (``pip install cadence[ray]``); Ray is imported here, when it is used."""
    from cadence.engines.ray import RayPlacement

    return RayPlacement(address, threads)
