"""Op-level grafting: the recorder dumps both runs, compare matches their calls and judges each
one (its rules, its local and accumulated error), and a dispatch mode replaces one matched call's
output in a target rerun by the bench's.

Calls are found again by their place in execution order: the recorder numbers every forward
ATen call (``Record.seq``) and ``GraftOps`` counts them the same way, at the same place on the
dispatch-mode stack (above a fault injector or a backend's own modes, where the recorder was).
"""
from __future__ import annotations

import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten
from torch.utils._python_dispatch import TorchDispatchMode

# Every input and output of a recorded call is saved (inputs first): the graft needs the bench's
# outputs, compare's local error the target's inputs.
SAVE_TENSORS = 64


@dataclass
class OpCall:
    """One matched call pair as compare judged it."""

    name: str  #: compare's name of the bench record, module/op#seq
    module: str
    op: str
    output: int  #: which output tensor
    bench_seq: int
    target_seq: int
    status: str
    origin: str
    cause: str
    local_err: float | None
    local_floor: float | None
    accumulated_err: float | None


class GraftOps(TorchDispatchMode):
    """Replace output ``k`` of target call ``seq`` by ``value`` cast to that output's dtype."""

    def __init__(self, grafts: dict[int, tuple[str, int, torch.Tensor]]) -> None:
        super().__init__()
        self.grafts = grafts
        self.seq = 0
        self.done = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if torch._C._current_graph_task_id() != -1:  # the recorder numbers forward calls only
            return out
        seq, self.seq = self.seq, self.seq + 1
        g = self.grafts.get(seq)
        if g is None:
            return out
        op, k, value = g
        if str(func) != op:
            raise RuntimeError(f"op graft: call #{seq} is {func}, the recorded run had {op}: "
                               "the model does not issue the same calls on every run")
        leaves, spec = tree_flatten(out)
        tensors = [i for i, t in enumerate(leaves) if isinstance(t, torch.Tensor)]
        if k < len(tensors):
            t = leaves[tensors[k]]
            if t.is_floating_point() and t.shape == value.shape:
                leaves[tensors[k]] = value.to(device=t.device, dtype=t.dtype, copy=True)
                self.done += 1
        return tree_unflatten(leaves, spec)


def record(run, folder: Path) -> Path:
    """Run ``run(above)`` with the recorder as the ``above`` context; the dump's folder."""
    import xray

    holder: dict[str, Any] = {}

    def recorder():
        session = xray.dump(dump_dir=folder, X_DEDUP=False, X_DUMP_NUM=SAVE_TENSORS)
        return _Keep(session, holder)

    run(recorder)
    return Path(holder["folder"])


class _Keep:
    """A dump session that remembers its folder."""

    def __init__(self, cm, holder: dict) -> None:
        self.cm, self.holder = cm, holder

    def __enter__(self):
        session = self.cm.__enter__()
        self.holder["folder"] = session.folder
        return session

    def __exit__(self, *exc):
        return self.cm.__exit__(*exc)


def matched_calls(bench: Path, target: Path) -> tuple[list[OpCall], Any]:
    """Compare's rows of every matched op output pair, and its summary."""
    from ..compare import compare_dumps

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = compare_dumps(bench, target, progress=False)
    calls = []
    for r in result.rows:
        if r.kind != "op" or r.bench_seq is None or r.target_seq is None or not r.tensor.startswith("out"):
            continue
        try:
            k = int(r.tensor[3:])
        except ValueError:
            continue
        # the module path as recorded (compare's ``module`` column strips wrapper prefixes)
        module = r.bench_name.rpartition("/")[0]
        calls.append(OpCall(r.bench_name, module, r.bench_op, k, r.bench_seq, r.target_seq, r.status,
                            r.origin, r.cause, r.local_err, r.local_floor, r.accumulated_err))
    return calls, result.summary


def bench_values(bench: Path, calls: list[OpCall]) -> dict[tuple[int, int], torch.Tensor]:
    """(bench seq, output) -> the saved tensor, for the calls given."""
    from ..dump import load_dump

    wanted = {(c.bench_seq, c.output) for c in calls}
    seqs = {s for s, _ in wanted}
    values = {}
    with load_dump(bench) as dump:
        for rec in dump.records:
            if rec.seq not in seqs:
                continue
            for k, meta in enumerate(rec.outputs):
                if (rec.seq, k) in wanted and getattr(meta, "data", None):
                    values[(rec.seq, k)] = dump.load_tensor(meta)
    return values


class Workdir:
    """A scratch folder for the two dumps, removed afterwards unless the caller keeps it."""

    def __init__(self, keep: Path | None = None) -> None:
        self.path = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="xray-explain-"))
        self.keep = keep is not None

    def __enter__(self) -> Path:
        self.path.mkdir(parents=True, exist_ok=True)
        return self.path

    def __exit__(self, *exc) -> None:
        if not self.keep:
            shutil.rmtree(self.path, ignore_errors=True)
