"""Flatten any dump (trace or module-level) into comparable entries: records with output tensors.

Compare knows dumps only through the shared data model (Record, TensorMeta), so it works on every
format ``xray.load_dump`` reads. Wrapper prefixes are stripped from module paths here, once.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from ..dump.model import Record, TensorMeta
from ..dump.protocol import Dump

# Prefixes added by wrappers (DDP/FSDP ``module.``, torch.compile ``_orig_mod.``, HF ``model.``);
# stripped repeatedly so ``module._orig_mod.model.layers.0`` and ``layers.0`` name the same module.
WRAPPER_PREFIXES = ("module.", "_orig_mod.", "model.")
_WRAPPER_NAMES = tuple(p[:-1] for p in WRAPPER_PREFIXES)


def normalize_path(path: str | None) -> str:
    p = path or ""
    changed = True
    while changed:
        changed = False
        for pre in WRAPPER_PREFIXES:
            if p.startswith(pre):
                p, changed = p[len(pre):], True
        if p in _WRAPPER_NAMES:
            p, changed = "", True
    return p


@dataclass
class Entry:
    """One record that produced tensors, at position ``pos`` of its dump's comparable sequence."""

    pos: int
    record: Record
    path: str  # module path, wrapper prefixes stripped
    outputs: list[tuple[str, TensorMeta]]
    inputs: list[tuple[str, TensorMeta]]

    @property
    def kind(self) -> str:
        return self.record.kind

    @property
    def op(self) -> str:
        return self.record.op

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def direction(self) -> str:
        return self.record.direction

    @property
    def group(self) -> tuple:
        """Only entries of one group can match: same kind, direction and training step."""
        r = self.record
        return (r.kind, r.direction, r.step)

    @cached_property  # read for every feature, anchor key and score: build it once
    def shapes(self) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(m.shape) for _, m in self.outputs)

    @cached_property
    def dtypes(self) -> tuple[str, ...]:
        return tuple(m.dtype for _, m in self.outputs)


def entries_of(dump: Dump) -> list[Entry]:
    """The dump's records that output at least one tensor, in execution order."""
    out: list[Entry] = []
    for rec in dump.records:
        outputs = list(rec.output_tensors())
        if not outputs:
            continue
        out.append(Entry(len(out), rec, normalize_path(rec.module), outputs, list(rec.input_tensors())))
    return out
