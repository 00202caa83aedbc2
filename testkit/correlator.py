"""The correlator's settings for tests, from the option table's defaults like `run`'s."""
from __future__ import annotations

from typing import Any

from exporter.config.decide import correlator_config
from exporter.config.options import Options
from exporter.correlate.config import CorrelatorConfig


def config(kubernetes: bool = False, **options: Any) -> CorrelatorConfig:
    """CorrelatorConfig as `run --coalesce-window ...` would build it; unset options default."""
    return correlator_config(Options(**options), kubernetes)
