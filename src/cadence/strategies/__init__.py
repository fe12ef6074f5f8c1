"""Training strategies: *how* batches flow and when updates are applied, one package per family
(``pipelined``, ``parameter_server``, ``shadowsync``, ``adapm``), each owning its runtime
(``<family>.strategy``: its entries in the one registry, ``catalog.STRATEGIES``) and its settings
(``<family>.settings``: its config sections, registered with ``cadence.settings.SECTIONS``; the two
families on the parameter server share its ``ps.*``, ``cadence.ps.settings``).

Importing this package imports only the families' settings, no training code: a config is read
(``cadence.config``) before torch is imported (``cadence train --strategy auto`` runs its trials
first, docs/auto.md); ``cadence`` imports it, so every section is known wherever a config is.
"""

from __future__ import annotations

# (in this order: the sections' order in config.yaml, after the root sections)
from cadence.ps import settings as parameter_server_settings
from cadence.strategies.shadowsync import settings as shadowsync_settings
from cadence.strategies.pipelined import settings as pipelined_settings
from cadence.strategies.adapm import settings as adapm_settings  # noqa: I001

FAMILY_SETTINGS = (parameter_server_settings, shadowsync_settings, pipelined_settings, adapm_settings)
