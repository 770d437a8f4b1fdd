"""xray-replay: re-run recorded ops and modules on deployment backends (docs/replay.md)."""
from __future__ import annotations

__all__ = ["ReplayStatus", "replay_dump", "ReplayConfig", "replay_sweep", "load_sweep"]


def __getattr__(name):  # keep ``import xray.replay`` (and ``xray-replay --help``) free of torch
    if name == "ReplayStatus":
        from ..backends.base import ReplayStatus

        return ReplayStatus
    if name in ("replay_dump", "ReplayConfig"):
        from . import runner

        return getattr(runner, name)
    if name in ("replay_sweep", "load_sweep"):
        from . import sweep

        return getattr(sweep, name)
    raise AttributeError(name)
