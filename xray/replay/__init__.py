"""xray-replay: re-run recorded ops and modules on deployment backends (docs/replay.md)."""
from __future__ import annotations

from ..backends.base import ReplayStatus

__all__ = ["ReplayStatus", "replay_dump", "ReplayConfig"]


def __getattr__(name):  # keep ``import xray.replay`` light: the runner pulls in more
    if name in ("replay_dump", "ReplayConfig"):
        from . import runner

        return getattr(runner, name)
    raise AttributeError(name)
