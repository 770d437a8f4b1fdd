"""xray-replay: re-run recorded ops and modules on deployment backends (docs/replay.md)."""
from __future__ import annotations

__all__ = ["ReplayStatus", "replay_dump", "ReplayConfig"]


def __getattr__(name):  # keep ``import xray.replay`` (and ``xray-replay --help``) free of torch
    if name == "ReplayStatus":
        from ..backends.base import ReplayStatus

        return ReplayStatus
    if name in ("replay_dump", "ReplayConfig"):
        from . import runner

        return getattr(runner, name)
    raise AttributeError(name)
