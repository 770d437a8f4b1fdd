"""Dump settings: the X_DEBUG bit mask and the X_* knobs, from arguments or the environment."""
from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from pathlib import Path


class DebugFlags(enum.IntFlag):
    """Bits of ``X_DEBUG``. ``0x102`` = META | STATS; the op name is always recorded."""

    STATS = 0x002  #: min, max, mean, std over finite elements; NaN, +Inf, -Inf counts
    STACK = 0x004  #: the Python call stack (user frames) of each record
    BACKWARD = 0x008  #: also record ops that run during backward
    MODULES = 0x010  #: a record per nn.Module call with its inputs' and outputs' metadata
    META = 0x100  #: shapes, dtypes, strides, devices and every non-tensor argument value


DEFAULT_DEBUG = DebugFlags.META | DebugFlags.STATS


def _env_bool(value: str) -> bool:
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected a boolean (1/0/true/false), got {value!r}")


def _env_int(name: str, value: str) -> int:
    try:
        return int(value.strip(), 0)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer (e.g. 0x102)") from None


@dataclass(frozen=True)
class DumpConfig:
    debug: DebugFlags = DEFAULT_DEBUG
    dedup: bool = True
    dedup_records: int = 2  # records per de-dup key before its calls fold (Recorder._folds_into)
    # within a key's first pass (one outermost module call, what follows it up to the next),
    # each call keeps a record up to this many: a loop's steps fold from the next pass on
    dedup_pass_records: int = 64
    dump_num: int = 5
    dump_dir: Path = Path("xray_debug")
    stack_depth: int = 8
    flush_records: int = 4096
    flush_seconds: float = 1.0
    flush_bytes: int = 256 << 20  # saved tensor bytes held in memory before a segment is written

    def has(self, flag: DebugFlags) -> bool:
        return bool(self.debug & flag)

    @classmethod
    def resolve(cls, X_DEBUG: int | None = None, X_DEDUP: bool | None = None, X_DUMP_NUM: int | None = None,
                dump_dir: str | os.PathLike | None = None, **extra) -> "DumpConfig":
        """Explicit arguments win; then X_DEBUG/X_DEDUP/X_DUMP_NUM/X_DUMP_DIR; then defaults."""
        env = os.environ
        if X_DEBUG is None and "X_DEBUG" in env:
            X_DEBUG = _env_int("X_DEBUG", env["X_DEBUG"])
        if X_DEDUP is None and "X_DEDUP" in env:
            X_DEDUP = _env_bool(env["X_DEDUP"])
        if X_DUMP_NUM is None and "X_DUMP_NUM" in env:
            X_DUMP_NUM = _env_int("X_DUMP_NUM", env["X_DUMP_NUM"])
        if dump_dir is None and "X_DUMP_DIR" in env:
            dump_dir = env["X_DUMP_DIR"]
        given = dict(extra)  # anything left None takes the dataclass default, spelled once above
        if "dedup_records" not in given and "X_DEDUP_RECORDS" in env:
            given["dedup_records"] = _env_int("X_DEDUP_RECORDS", env["X_DEDUP_RECORDS"])
        if int(given.get("dedup_records", 1)) < 1:
            raise ValueError(f"dedup_records (X_DEDUP_RECORDS) must be >= 1, got {given['dedup_records']}")
        if "dedup_pass_records" not in given and "X_DEDUP_PASS_RECORDS" in env:
            given["dedup_pass_records"] = _env_int("X_DEDUP_PASS_RECORDS", env["X_DEDUP_PASS_RECORDS"])
        if int(given.get("dedup_pass_records", 1)) < 1:
            raise ValueError("dedup_pass_records (X_DEDUP_PASS_RECORDS) must be >= 1, got "
                             f"{given['dedup_pass_records']}")
        if "flush_bytes" not in given and "X_FLUSH_BYTES" in env:
            given["flush_bytes"] = _env_int("X_FLUSH_BYTES", env["X_FLUSH_BYTES"])
        if int(given.get("flush_bytes", 1)) <= 0:
            raise ValueError(f"flush_bytes (X_FLUSH_BYTES) must be > 0, got {given['flush_bytes']}")
        if X_DEBUG is not None:
            if isinstance(X_DEBUG, (str, os.PathLike)):  # begin_dump("folder") is a common slip
                try:
                    X_DEBUG = int(os.fspath(X_DEBUG).strip(), 0)
                except ValueError:
                    raise ValueError(f"X_DEBUG must be an integer of debug flags (e.g. 0x102), got "
                                     f"{os.fspath(X_DEBUG)!r}; a dump's folder is dump_dir=") from None
            given["debug"] = DebugFlags(int(X_DEBUG))
        if X_DEDUP is not None:
            given["dedup"] = bool(X_DEDUP)
        if X_DUMP_NUM is not None:
            if int(X_DUMP_NUM) < 0:
                raise ValueError(f"X_DUMP_NUM must be >= 0, got {X_DUMP_NUM}")
            given["dump_num"] = int(X_DUMP_NUM)
        if dump_dir is not None:
            given["dump_dir"] = Path(dump_dir)
        return cls(**given)

    def to_json(self) -> dict:
        out = {"X_DEBUG": int(self.debug), "X_DEDUP": self.dedup, "X_DUMP_NUM": self.dump_num,
               "flags": [f.name for f in DebugFlags if self.debug & f]}
        if self.dedup:  # a call folds into a record of its signature in its own module (encode.dedup_key)
            out["dedup_scope"] = "module"
            out["dedup_records"] = self.dedup_records
            out["dedup_pass_records"] = self.dedup_pass_records
        return out
