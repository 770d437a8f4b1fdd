"""A sharded run as the one run it stands for: its rank dumps put back together, so that compare
pairs it with a single-device run of the same model (``xray-compare single/ sharded/ out.csv``).

Why rebuild the sharded side rather than slice the single run to each shard: every tensor of the
single run is then compared whole, by the same engine and rules as any two runs, whether or not
the single run saved its tensors (slicing needs them saved), and a partial sum (a row-parallel
matmul, each rank holding one term) can only be judged once its terms are added. The rank a fault
sits in is named afterwards, where both sides saved the tensor: each rank's shard against the
single run's slice of it.

How each tensor is rebuilt (docs/distributed.md, "Against a single-device run"):

- a DTensor, by its ``sharding``: ``S(d)`` shards placed at their ``global_offset``, ``R`` taken
  from the first coordinate, ``P(sum)``/``P(avg)`` terms added (averaged);
- a plain tensor (a ``to_local()`` shard, DDP's batch slice), by its shape against the single
  run's matched record: one dimension the ranks split in rank order, or, with the single run's
  shape, one copy when every rank holds the same values;
- from the ranks' saved tensors when they all saved it (exact statistics and sample), else from
  their statistics (min, max and the count-weighted mean and std of disjoint shards are exact; the
  sample cannot be re-drawn and is dropped; a partial sum cannot be rebuilt and is not compared).

A DTensor call's own kernels (its redistributions' collectives, the local op on the shards) are
dropped: the DTensor record stands for them, with their saved tensors. Collectives at top level
are dropped too: the single run has none. Under data parallelism (the ranks read different
inputs, DDP), each rank's backward is the gradient of its own batch: only the averaged gradients
DDP's all-reduce writes back into each ``.grad`` are compared, in place of the record that made
that ``.grad``.
"""
from __future__ import annotations

import math
import os
import re
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from ..dump.model import Record, Sharding, Stats, TensorMeta, iter_tensors
from ..ops.rebuild import contiguous_stride
from ..ops.reads import fills
from .sync_points import is_collective

DATA_PREFIX = "unshard:"
OWN_BATCH = ("the ranks' slices joined, or their terms added, and divided by the world size where the ranks' "
             "losses were normalised by their own batch: the factor, 1 or the world size, read from the single "
             "run's statistics")
CACHE_BYTES = 256 << 20  # rebuilt tensors kept: rebuilding reads every shard once, compare reads the tensor again
_HELPERS = ("_c10d_functional.wait_tensor.default", "_c10d_functional._wrap_tensor_autograd.default")
_VIEWS = ("aten.as_strided.default", "aten.view.default", "aten._unsafe_view.default", "aten.alias.default")
_MOVES = _VIEWS + ("aten.split.Tensor", "aten.split_with_sizes.default", "aten.copy_.default", "aten.narrow.default",
                   "aten.slice.Tensor", "aten.reshape.default", "aten.t.default", "aten.detach.default")
_ALLOCATIONS = ("aten.empty.memory_format", "aten.empty_strided.default", "aten.empty_like.default",
                "aten.new_empty.default", "aten.new_empty_strided.default")


@dataclass
class Part:
    """One rank's piece of a global tensor: its recorded meta, placed at ``offset``."""

    rank: int
    meta: TensorMeta
    offset: tuple[int, ...]


@dataclass
class Assembly:
    """How one global tensor is made of the ranks' pieces: ``shard`` places them, ``copy`` takes
    the first, ``sum``/``avg`` adds them (partial values)."""

    how: str
    shape: tuple[int, ...]
    dtype: str
    parts: list[Part]
    per: int = 1  # the rebuilt tensor divided by this: a rank's own-batch gradient, W times its share
    pick: int = 0  # "replicas": the part that stands for the tensor

    def shard_of(self, rank: int) -> Part | None:
        return next((p for p in self.parts if p.rank == rank), None) if self.how == "shard" else None


@dataclass
class Unsharded:
    """What rebuilding found: per global tensor, its assembly (by record seq and tensor name)."""

    assemblies: dict[tuple[int, str], Assembly] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    skipped: dict[tuple[int, str], str] = field(default_factory=dict)  # (seq, tensor) -> why not rebuilt


class RebuiltDataset:
    """A rebuilt tensor read as a saved one's dataset (``UnshardedRun.dataset``): its shape, its
    dtype in the header, and slices as arrays (compare reads large tensors chunk by chunk)."""

    def __init__(self, t: torch.Tensor) -> None:
        from ..dump.tensorio import DTYPE_ATTR, dtype_name, to_numpy

        self.array = to_numpy(t.contiguous(), copy=False)
        self.shape, self.dtype = tuple(t.shape), dtype_name(t.dtype)
        self.attrs = {DTYPE_ATTR: self.dtype}

    def __getitem__(self, selection: Any) -> np.ndarray:
        return self.array[selection].copy()  # the reader owns what it gets, as from h5py


class UnshardError(ValueError):
    """The rank dumps cannot be put back together; the message says why."""


def rank_dumps(folder: str | os.PathLike) -> list[tuple[str, Path]]:
    """(rank label, dump path) of every rank of a multi-rank folder, in rank order; [] when
    ``folder`` is not one (a single dump, or dumps that are not all ``rank_<r>``)."""
    from .pairing import global_rank
    from .pairing import dump_units

    units = dump_units(folder)
    if len(units) < 2 or any(global_rank(n) is None for n in units):
        return []
    return sorted(units.items(), key=lambda kv: global_rank(kv[0]))


class UnshardedRun:
    """The ranks of a sharded run as one dump (``xray.dump.protocol.Dump``): records in rank 0's
    order and seqs with global tensors; ``load_tensor`` rebuilds a tensor from the ranks' saved
    shards. ``guide``: the single-device run it will be compared with, whose shapes say how a
    plain tensor was split."""

    format = "xray-trace"
    complete = True

    def __init__(self, folder: str | os.PathLike, guide: Any) -> None:
        from .pairing import open_dump

        self.folder = Path(folder)
        self.labels, self.ranks, self._warnings = [], [], []
        for label, path in rank_dumps(folder):
            self.labels.append(label)
            self.ranks.append(open_dump(path, f"sharded ({label})", self._warnings))
        if not self.ranks:
            raise UnshardError(f"{folder}: not a folder of rank_<r>/ dumps")
        self.header = dict(self.ranks[0].header or {})
        self.summary = _merged_summary(self.labels, self.ranks)
        self.complete = all(getattr(d, "complete", True) is not False for d in self.ranks)
        self.found = Unsharded(notes=list(self._warnings))
        self._data_parallel = False
        self.groups: dict[int, list[Record]] = {}  # rebuilt record's seq -> each rank's record of the call
        self._replaced: set[int] = set()  # rebuilt records whose outputs are the all-reduced gradients
        self._rank_local: dict[tuple[int, int], tuple[bool, Any]] = {}  # (seq, output) -> (steps, errors)
        self._cache: OrderedDict[int, torch.Tensor] = OrderedDict()
        self._cached_bytes = 0
        self._ids: list[Assembly] = []
        self.records = self._rebuild(guide)

    # -- the Dump protocol ------------------------------------------------------------------
    def __iter__(self) -> Iterator[Record]:
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)

    def has_data(self, meta: TensorMeta) -> bool:
        return isinstance(meta.data, str) and meta.data.startswith(DATA_PREFIX)

    def load_tensor(self, meta: TensorMeta | str) -> torch.Tensor:
        ref = meta if isinstance(meta, str) else meta.data
        if not isinstance(ref, str) or not ref.startswith(DATA_PREFIX):
            raise KeyError(f"{self.folder}: no rebuilt tensor {ref!r}")
        i = int(ref[len(DATA_PREFIX):])
        got = self._cache.get(i)
        if got is None:
            got = self._assemble(self._ids[i])
            self._cache[i] = got
            self._cached_bytes += got.numel() * got.element_size()
            while len(self._cache) > 1 and self._cached_bytes > CACHE_BYTES:  # each tensor is read again by compare
                _, gone = self._cache.popitem(last=False)
                self._cached_bytes -= gone.numel() * gone.element_size()
        else:
            self._cache.move_to_end(i)
        return got

    def dataset(self, meta: TensorMeta | str) -> RebuiltDataset:
        """The rebuilt tensor as a saved one's dataset: what ``ops.rebuild`` checks before it
        loads a saved tensor (so that a rebuilt call is recomputed on its inputs: local error),
        and what compare reads in chunks."""
        return RebuiltDataset(self.load_tensor(meta))

    def own_local_error(self, record: Record, k: int, *, steps: bool = True) -> Any:
        """The local error of rebuilt call ``record``'s output ``k``: the worst rank's call
        recomputed on the inputs that rank held (``rank_local_errors``), or None, and the rebuilt
        call is recomputed instead. Why: where the ranks' copies of a replicated input disagree,
        the rebuilt input is one rank's copy, and the other ranks' shards, computed right on their
        own copies, would read as local error (a 1 % fault in a norm that every rank repeats made
        each column-parallel matmul after it look wrong, and then look like a precision step)."""
        errs = self.rank_local_errors(record.seq, k, steps=steps)
        return None if errs is None else max(errs, key=lambda le: le.local)

    def rank_local_errors(self, seq: int, k: int, *, steps: bool = True) -> list[Any] | None:
        """Each rank's call of rebuilt record ``seq`` recomputed on its own saved inputs
        (``local.local_error``; a DTensor call's local kernel, on the rank's shards), output ``k``;
        None where one cannot be (nothing saved, a DTensor call whose local kernel is not one call
        of its op, a gradient the all-reduce averaged: no rank's call made the rebuilt value)."""
        if (seq, k) in self._rank_local and (steps is False or self._rank_local[(seq, k)][0]):
            return self._rank_local[(seq, k)][1]  # attribution measured it; blame_ranks reads it again
        group = self.groups.get(seq)
        if group is None or len(group) < 2 or seq in self._replaced:
            return None
        errs = self._measure_ranks(group, k, steps)
        self._rank_local[(seq, k)] = (steps, errs)
        return errs

    def _measure_ranks(self, group: list[Record], k: int, steps: bool) -> list[Any] | None:
        from .local import local_error

        errs = []
        for dump, rec, kernels in zip(self.ranks, group, self._kernels):
            if rec.kernels:
                local = [r for r in kernels.get(rec.seq, ()) if r.op == rec.op]
                if len(local) != 1:
                    return None
                rec = local[0]
            outs = list(rec.output_tensors())
            le = local_error(rec, dump, outs[k][1], k, steps=steps) if k < len(outs) else None
            if le is None:
                return None
            errs.append(le)
        return errs

    def close(self) -> None:
        for d in self.ranks:
            close = getattr(d, "close", None)
            if callable(close):
                close()
        self._cache.clear()
        self._cached_bytes = 0

    def __enter__(self) -> "UnshardedRun":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- rebuilding -------------------------------------------------------------------------
    def _rebuild(self, guide: Any) -> list[Record]:
        per_rank = [_logical(list(d.records)) for d in self.ranks]
        kernels = self._kernels = [k for _, k, _, _, _ in per_rank]
        logical = [recs for recs, _, _, _, _ in per_rank]
        dropped, self._moved = per_rank[0][2], per_rank[0][3]
        self._partials = {_moved_source(src, self._moved): how for src, how in per_rank[0][4].items()}
        n = len(logical[0])
        for label, recs in zip(self.labels[1:], logical[1:]):
            if len(recs) != n:
                raise UnshardError(f"{self.folder}: {self.labels[0]} and {label} ran different calls "
                                   f"({n} and {len(recs)} records once DTensor kernels and collectives are left "
                                   "out): not one SPMD step; compare the ranks with a run of the same layout")
        for i in range(n):
            first = logical[0][i]
            for label, recs in zip(self.labels[1:], logical[1:]):
                r = recs[i]
                if (r.op, r.direction, r.module) != (first.op, first.direction, first.module):
                    raise UnshardError(f"{self.folder}: {self.labels[0]} ran {first.name} where {label} ran "
                                       f"{r.name}: the ranks ran different calls")
        if dropped:
            self.found.notes.append(f"sharded run: {dropped} records per rank (DTensor kernels, collectives, "
                                    "to_local/from_local aliases) are folded into the calls they served (the single "
                                    "run has none)")
        waited = {r.seq for r in self.ranks[0].records if r.kind == "op" and (is_collective(r.op) or r.op in _HELPERS)}
        order = _unwaited(logical[0], waited, self._moved)
        logical = [[recs[j] for j in order] for recs in logical]
        partners = _partners(logical[0], guide)
        data_parallel = self._data_parallel = _reads_different_inputs(logical)
        averaged = _averaged_gradients(self.ranks, logical) if data_parallel else [{} for _ in logical]
        sharded = [_sharded_gradients(list(d.records)) for d in self.ranks]
        kept = [{r.seq for r in recs} for recs in logical]
        for av, sg, k in zip(averaged, sharded, kept):
            av.update({s: v for s, v in sg.items() if s in k})
        out: list[Record] = []
        local = 0
        for i in range(n):
            group = [recs[i] for recs in logical]
            self.groups[group[0].seq] = group
            bench = partners.get(i)
            own_batch = data_parallel and group[0].direction == "backward" and group[0].seq not in averaged[0]
            if own_batch and not _replicated_like(group, bench):
                local += 1
                if bench is None:  # DDP's own bucket arithmetic: the single run has none
                    continue
                out.append(self._global_record(group, bench, [k.get(r.seq, []) for k, r in zip(kernels, group)],
                                               own_batch=True))
                continue
            if group[0].seq in averaged[0]:
                self._replaced.add(group[0].seq)
                group = [replace(r, outputs=_with_outputs(r, av[r.seq])) for r, av in zip(group, averaged)]
            out.append(self._global_record(group, bench, [k.get(r.seq, []) for k, r in zip(kernels, group)]))
        if data_parallel:
            n_avg = sum(len(v) for v in averaged[0].values())
            how = ("reduce-scattered gradient shards, joined" if any(sharded) else "averaged gradients (after the "
                   "all-reduce)")
            self.found.notes.append(
                f"data parallelism (the ranks read different inputs): {local} backward records per rank are "
                f"gradients of each rank's own batch, rebuilt as the whole batch's ({OWN_BATCH}); {n_avg} {how} are "
                "compared in place of the records that made each .grad")
        return out

    def _global_record(self, group: list[Record], bench: Record | None, kernels: list[list[Record]],
                       own_batch: bool = False) -> Record:
        """The ranks' records of one call as one. ``own_batch``: a backward record under data
        parallelism, each rank's gradient of its own batch (``_batch_share``)."""
        first = group[0]
        bench_in = dict(bench.input_tensors()) if bench is not None else {}
        bench_out = dict(bench.output_tensors()) if bench is not None else {}

        read: list[str] = []  # how each input was rebuilt ("copy": alike on every rank)

        def rebuild(name: str, metas: list[TensorMeta], guide: TensorMeta | None) -> TensorMeta:
            metas = [_with_kernel_data(m, name, k) for m, k in zip(metas, kernels)]
            source = _moved_source(metas[0].source, self._moved)
            output = re.fullmatch(r"out\d+", name) is not None
            made = f"op:{first.seq}:{name[3:]}" if output else source
            partial = self._partials.get(made) or ("sum" if own_batch else None) or (
                _over_the_batch(first, self.found.assemblies.get((first.seq, "self"))) if output else None)
            # every rank makes alike what it computes from values alike on every rank, or from none
            # (a fill), even where the ranks read different inputs (data parallelism)
            alike = output and (fills(first.op) or (bool(read) and all(how == "copy" for how in read)))
            a = self._assembly(metas, guide, partial, alike=alike)
            if not output:
                read.append(a.how if isinstance(a, Assembly) else "")
            if own_batch and isinstance(a, Assembly) and guide is not None:
                a = self._batch_share(a, metas, guide)
            if isinstance(a, str):
                self.found.skipped[(first.seq, name)] = a
                return replace(metas[0], stats=None, data=None, sharding=None, note=a, source=source)
            self.found.assemblies[(first.seq, name)] = a
            return replace(self._meta_of(a, metas[0]), source=source)

        inputs = _map_tensors(first.inputs, [r.inputs for r in group], "", bench_in, rebuild, keyed=True)
        outputs = [_map_tensors(v, [r.outputs[k] for r in group], f"out{k}", bench_out, rebuild)
                   for k, v in enumerate(first.outputs)]
        return replace(first, inputs=self._global_sizes(first, inputs), outputs=outputs, kernels=0)

    def _global_sizes(self, rec: Record, inputs: dict) -> dict:
        """``inputs`` with each size argument that is the shape of this rank's shard of one of
        the record's tensors (``slice_backward``'s ``input_sizes``, a view's ``size``, under
        tensor parallelism a head count split) made that tensor's global shape: the call
        stands for the single run's, which took the global sizes."""
        shapes: dict[tuple[int, ...], set[tuple[int, ...]]] = {}
        for (seq, _), a in self.found.assemblies.items():
            if seq == rec.seq and a.how == "shard" and tuple(a.parts[0].meta.shape) != a.shape:
                shapes.setdefault(tuple(a.parts[0].meta.shape), set()).add(a.shape)

        def whole(v: Any) -> Any:
            if isinstance(v, (list, tuple)) and v and all(type(x) is int for x in v):
                found = shapes.get(tuple(v), set())
                if len(found) == 1:  # one tensor of that shard shape, or all alike: no doubt which
                    return type(v)(next(iter(found)))
            return v

        return {k: whole(v) for k, v in inputs.items()} if shapes else inputs

    def _assembly(self, metas: list[TensorMeta], guide: TensorMeta | None, partial: str | None = None,
                  alike: bool = False) -> Assembly | str:
        """How the ranks' ``metas`` make one tensor, or why they cannot. ``partial``: the
        reduction ("sum", "avg") an all-reduce applied to this value across the ranks. ``alike``:
        every rank makes this value alike (computed from values alike on every rank, or a fill:
        the ``ones_like`` that seeds each rank's backward), even where the ranks read different
        inputs."""
        if any(m.sharding is not None for m in metas):
            return _by_placements(metas, guide)
        shapes = {tuple(m.shape) for m in metas}
        if len(shapes) == 1 and (guide is None or tuple(guide.shape) == tuple(metas[0].shape)):
            zero = (0,) * len(metas[0].shape)
            if _same_values(metas):
                return Assembly("copy", tuple(metas[0].shape), metas[0].dtype, [Part(0, metas[0], zero)])
            if partial is not None:  # each rank's term of what the all-reduce added up
                return Assembly(partial, tuple(metas[0].shape), metas[0].dtype,
                                [Part(r, m, zero) for r, m in enumerate(metas)])
            if (alike or not self._data_parallel) and guide is not None:  # replicated work gone wrong on a rank
                return Assembly("replicas", tuple(metas[0].shape), metas[0].dtype,
                                [Part(r, m, zero) for r, m in enumerate(metas)], pick=_farthest(metas, guide))
            return ("ranks hold different values of one shape (not a shard of the single run's tensor, nor a copy): "
                    "not rebuilt")
        if guide is None:
            return "the ranks' shapes differ and no single-run record says how they join: not rebuilt"
        dim = _split_dim([tuple(m.shape) for m in metas], tuple(guide.shape))
        if dim is None:
            return (f"shards {sorted(shapes)} do not join into the single run's {tuple(guide.shape)} along one "
                    "dimension: not rebuilt")
        parts, at = [], 0
        for r, m in enumerate(metas):
            offset = tuple(at if d == dim else 0 for d in range(len(m.shape)))
            parts.append(Part(r, m, offset))
            at += m.shape[dim]
        return Assembly("shard", tuple(guide.shape), metas[0].dtype, parts)

    def _batch_share(self, a: Assembly, metas: list[TensorMeta], guide: TensorMeta) -> Assembly | str:
        """A rank's gradient of its own batch as the whole batch's: slices joined (per-sample
        values), or, of one shape but different values on the ranks (a weight's gradient, summed
        over the batch), the ranks' terms added. Each rank's loss is normalised by its own
        batch where DDP and FSDP2 average the ranks' gradients: past that normalisation in the
        backward a rank's values are W times its share, before it (the loss's seed) they are
        not. Which factor, 1 or W, is read from the single run's statistics (root mean square),
        as the dimension the slices join along is read from its shape: the two differ by W, a
        fault of a few percent cannot make one pass for the other."""
        if a.how not in ("shard", "sum"):
            return a
        want = _rms(guide.stats)
        if a.how == "shard":
            got = _rms(combined_stats([p.meta.stats for p in a.parts]))
        else:
            try:
                got = float(self._assemble(a).double().pow(2).mean().sqrt())
            except (KeyError, OSError, ValueError, RuntimeError):
                got = None
        if want and got:
            a.per = min((1, len(metas)), key=lambda f: abs(math.log(got / f / want)))
        return a

    def _meta_of(self, a: Assembly, like: TensorMeta) -> TensorMeta:
        """The global tensor's meta: statistics and sample of the rebuilt tensor when every part
        was saved, else combined from the parts' statistics (no sample)."""
        from ..dump.stats import tensor_stats

        saved = all(p.meta.data is not None and p.meta.note is None for p in a.parts)
        meta = replace(like, shape=a.shape, stride=contiguous_stride(a.shape), storage_offset=0, sharding=None, data=None,
                       note=None)
        if saved:
            self._ids.append(a)
            ref = f"{DATA_PREFIX}{len(self._ids) - 1}"
            try:
                t = self.load_tensor(ref)
            except (KeyError, OSError, ValueError, RuntimeError):
                saved = False
                self._ids.pop()
            else:
                meta.data, meta.stats = ref, tensor_stats(t)
                return meta
        if a.how in ("copy", "replicas"):
            stats = a.parts[a.pick].meta.stats
            meta.stats = None if stats is None else replace(stats)
        elif a.how == "shard":
            meta.stats = _divided(combined_stats([p.meta.stats for p in a.parts]), a.per)
        elif (values := _scalars(a)) is not None:  # a scalar's statistics hold its value: terms add exactly
            total = sum(values) / (_partial_size(a) if a.how == "avg" else 1) / a.per
            meta.stats = tensor_stats(torch.tensor(total, dtype=torch.float64).reshape(a.shape))
        else:
            meta.stats, meta.note = None, f"a partial {a.how} whose terms were not saved on every rank: not rebuilt"
        return meta

    def _assemble(self, a: Assembly) -> torch.Tensor:
        if a.how == "replicas":
            p = a.parts[a.pick]
            return self.ranks[p.rank].load_tensor(p.meta).reshape(p.meta.shape)
        tensors = [self.ranks[p.rank].load_tensor(p.meta).reshape(p.meta.shape) for p in a.parts]
        if a.how == "copy":
            return tensors[0]
        if a.how == "shard":
            out = torch.empty(a.shape, dtype=tensors[0].dtype)
            for p, t in zip(a.parts, tensors):
                out[tuple(slice(o, o + n) for o, n in zip(p.offset, t.shape))] = t
            return out / a.per if a.per != 1 else out
        wide = torch.float64 if not tensors[0].is_complex() else torch.complex128
        out = torch.zeros(a.shape, dtype=wide)
        for p, t in zip(a.parts, tensors):
            out[tuple(slice(o, o + n) for o, n in zip(p.offset, t.shape))] += t.to(wide)
        if a.how == "avg":
            out /= _partial_size(a)
        return (out / a.per).to(tensors[0].dtype)


# -- which records stand for the run -------------------------------------------------------------


def _logical(records: list[Record]) -> tuple[list[Record], dict[int, list[Record]], int, dict[str, str],
                                             dict[str, str]]:
    """(the records that stand for one rank's step, DTensor record seq -> its kernels' records,
    how many were left out, data edges moved, partial values): a DTensor call's kernels,
    top-level collectives and the aliases DTensor's ``to_local``/``from_local`` make go. A value
    read from a record that went is read from the one that stands for it (the DTensor call, the
    alias's source, the all-reduce's input: ``_through_collective``)."""
    kept: list[Record] = []
    kernels: dict[int, list[Record]] = {}
    moved: dict[str, str] = {}
    partials: dict[str, str] = {}
    dropped = 0
    plumbing = _plumbing(records)
    for rec in records:
        if rec.seq in plumbing:
            dropped += 1
            continue
        if rec.kernels:
            lo = rec.seq - rec.kernels
            mine = [r for r in kept if r.seq >= lo]
            if mine:
                del kept[len(kept) - len(mine):]
                dropped += len(mine)
            kernels[rec.seq] = mine
            outs = list(rec.output_tensors())
            for k in mine:
                for i, (_, km) in enumerate(k.output_tensors()):
                    same = next((j for j, (_, m) in enumerate(outs) if tuple(m.shape) == tuple(km.shape)
                                 and m.stats == km.stats), None)
                    if same is not None:
                        moved[f"op:{k.seq}:{i}"] = f"op:{rec.seq}:{same}"
        elif rec.kind == "op" and (is_collective(rec.op) or rec.op in _HELPERS):
            dropped += 1
            _through_collective(rec, moved, partials)
            continue
        elif _alias(rec):
            dropped += 1
            moved[f"op:{rec.seq}:0"] = next(iter(rec.input_tensors()))[1].source or ""
            continue
        kept.append(rec)
    return kept, kernels, dropped, moved, partials


_ALL_REDUCES = ("_c10d_functional.all_reduce.default",)


def _through_collective(rec: Record, moved: dict[str, str], partials: dict[str, str]) -> None:
    """A top-level functional all-reduce (tensor parallelism's backward: each rank's partial
    gradient of a replicated input, summed) and the helpers that wait for or wrap its result:
    the single run has none, and computed the sum where the ranks computed their terms. Its
    result is read from the record that made its input, whose value is rebuilt as the ranks'
    terms added (``partials``: that source -> "sum" or "avg"); a helper's from its input."""
    ins = list(rec.input_tensors())
    if not ins or len(rec.outputs) != 1:
        return
    src = ins[0][1].source
    if not src or not src.startswith("op:"):
        return
    if rec.op in _HELPERS:
        moved[f"op:{rec.seq}:0"] = src
    elif rec.op in _ALL_REDUCES and rec.inputs.get("reduce_op") in ("sum", "avg"):
        moved[f"op:{rec.seq}:0"] = src
        partials[src] = rec.inputs["reduce_op"]


def _plumbing(records: list[Record]) -> set[int]:
    """Seqs of the records that only move data for a sharding library: FSDP2's ops (``fsdp.*``:
    copy into the all-gather buffer, split it into parameters, concatenate gradients for the
    reduce-scatter), the views and copies of collectives' and those ops' results, and the
    allocations and views that only feed them. The single run has none: the parameters it reads
    are the all-gathered ones, its gradients the reduce-scattered ones (``_sharded_gradients``)."""
    if not any(r.kind == "op" and (r.op or "").startswith("fsdp.") for r in records):
        return set()
    out: set[int] = set()
    consumers: dict[int, set[int]] = {}
    for r in records:
        if r.kind != "op":
            continue
        srcs = {p[0] for _, m in r.input_tensors() if (p := _producer(m)) is not None}
        for q in srcs:
            consumers.setdefault(q, set()).add(r.seq)
        if r.op.startswith("fsdp.") or is_collective(r.op) or r.op in _HELPERS:
            out.add(r.seq)
        elif r.op in _MOVES and srcs & out:
            out.add(r.seq)
    made = {r.seq for r in records if r.kind == "op"}
    allocs = {r.seq for r in records if r.kind == "op" and r.op in _ALLOCATIONS}
    for r in reversed(records):  # what only feeds them: their buffers, and views of what no call computed
        if r.kind == "op" and r.seq not in out and (r.op in _MOVES or r.op in _ALLOCATIONS):
            used = consumers.get(r.seq)
            fed = {p[0] for _, m in r.input_tensors() if (p := _producer(m)) is not None and p[0] in made}
            if used and used <= out and fed <= out | allocs:
                out.add(r.seq)
    return out


def _sharded_gradients(records: list[Record]) -> dict[int, dict[int, TensorMeta]]:
    """FSDP2's gradient shards of one rank: seq of the record that made an unsharded gradient ->
    {output index: this rank's shard of it after the reduce-scatter}. FSDP2 concatenates the
    gradients (``fsdp.chunk_cat``), reduce-scatters them, and takes each parameter's shard of the
    result with ``as_strided``, in the order they were concatenated."""
    by_seq = {r.seq: r for r in records}
    out: dict[int, dict[int, TensorMeta]] = {}
    derived: dict[int, int] = {}  # record seq -> the reduce-scatter it views or copies
    order: dict[int, list[tuple[int, int]]] = {}  # reduce-scatter seq -> the gradients concatenated
    shards: dict[int, list[TensorMeta]] = {}
    for r in records:
        if r.kind != "op":
            continue
        srcs = [p for _, m in r.input_tensors() if (p := _producer(m)) is not None]
        if "reduce_scatter" in r.op:
            feed = _producer(next((m for n, m in r.input_tensors() if n in ("input_tensor", "input", "inputs.0")), None))
            while feed is not None and feed[0] in by_seq and by_seq[feed[0]].op in _VIEWS:
                feed = _producer(next(iter(by_seq[feed[0]].input_tensors()), (None, None))[1])
            cat = by_seq.get(feed[0]) if feed is not None else None
            if cat is not None and cat.op == "fsdp.chunk_cat.default":
                order[r.seq] = [p for n, m in cat.input_tensors() if n.startswith("tensors.")
                                and (p := _producer(m)) is not None]
                derived[r.seq] = r.seq
            continue
        hit = next((derived[p[0]] for p in srcs if p[0] in derived), None)
        if hit is None:
            continue
        if r.op == "aten.as_strided.default" and r.direction == "backward":
            shards.setdefault(hit, []).extend(m for _, m in r.output_tensors())
        elif r.op in _MOVES:
            derived[r.seq] = hit
    for rs, grads in order.items():
        for (seq, idx), meta in zip(grads, shards.get(rs, [])):
            out.setdefault(seq, {})[idx] = meta
    return out


def _alias(rec: Record) -> bool:
    """A view of a plain tensor as itself (same shape, same values): DTensor's ``to_local`` and
    ``from_local`` make them, the single run has none."""
    if rec.kind != "op" or rec.op not in _VIEWS or len(rec.outputs) != 1:
        return False
    ins, outs = list(rec.input_tensors()), list(rec.output_tensors())
    if len(ins) != 1 or len(outs) != 1:
        return False
    a, b = ins[0][1], outs[0][1]
    return (a.sharding is None and b.sharding is None and tuple(a.shape) == tuple(b.shape)
            and a.stats is not None and a.stats == b.stats)


def _unwaited(records: list[Record], waited: set[int], moved: dict[str, str]) -> list[int]:
    """Positions of ``records`` in the order the single run computes them. A record that reads a
    collective's result runs on the ranks once that collective is waited for, after calls that
    do not need it (tensor parallelism: a weight's gradient before the all-reduced gradient of
    its input); the single run has no collective and computes it as soon as its inputs exist.
    Such a record is put right after the last record it reads from (``waited``: the seqs of
    the collectives and their helpers)."""
    pos = {r.seq: i for i, r in enumerate(records)}
    order = list(range(len(records)))
    for i, rec in enumerate(records):
        sources = [m.source for _, m in rec.input_tensors()]
        if not any(_seq_of(s) in waited for s in sources):
            continue
        made = {pos.get(_seq_of(_moved_source(s, moved))) for s in sources} - {None}
        if not made:
            continue
        after, now = max(order.index(j) for j in made), order.index(i)
        if after + 1 < now:
            order.insert(after + 1, order.pop(now))
    return order


def _seq_of(source: str | None) -> int | None:
    m = re.fullmatch(r"op:(\d+):\d+", source or "")
    return int(m.group(1)) if m else None


def _moved_source(source: str | None, moved: dict[str, str]) -> str | None:
    seen = 0
    while source in moved and seen < 64:
        source, seen = moved[source], seen + 1
    return source or None


def _partners(records: list[Record], guide: Any) -> dict[int, Record]:
    """Position in ``records`` -> the single run's record it pairs with: the longest common
    subsequence of (direction, module path, op). Shapes are left out: a rank's plain tensors
    are shards, which the pair is wanted to say how to join."""
    from difflib import SequenceMatcher

    from .entry_table import normalize_path

    def key(r: Record) -> tuple:
        return (r.kind, r.direction, normalize_path(r.module), r.op)

    bench = [r for r in guide.records if any(True for _ in r.output_tensors())]
    ours = [key(r) for r in records]
    matcher = SequenceMatcher(None, ours, [key(r) for r in bench], autojunk=False)
    out: dict[int, Record] = {}
    for a, b, n in matcher.get_matching_blocks():
        for k in range(n):
            out[a + k] = bench[b + k]
    return out


def _reads_different_inputs(logical: list[list[Record]]) -> bool:
    """Whether the ranks fed the model different values (data parallelism): a forward input that
    came from outside the recording differs between ranks."""
    for i, rec in enumerate(logical[0]):
        if rec.direction != "forward":
            continue
        for name, meta in rec.input_tensors():
            if meta.source != "input" or meta.sharding is not None:
                continue
            others = [dict(recs[i].input_tensors()).get(name) for recs in logical[1:]]
            if any(o is None for o in others):
                continue
            if not _same_values([meta, *others]):
                return True
    return False


def _averaged_gradients(ranks: list[Any], logical: list[list[Record]]) -> list[dict[int, dict[int, TensorMeta]]]:
    """Per rank: seq of the record that made a ``.grad`` -> {output index: that gradient after
    DDP's all-reduce}. DDP copies each averaged bucket slice into ``.grad`` (``aten.copy_``
    whose source is a view of the all-reduced bucket, whose destination that record made)."""
    out = []
    for dump in ranks:
        records = list(dump.records)
        comm = {r.seq for r in records if is_collective(r.op)}
        from_comm = set(comm)
        found: dict[int, dict[int, TensorMeta]] = {}
        for r in records:
            if r.kind != "op":
                continue
            srcs = [_producer(m) for _, m in r.input_tensors()]
            if r.op in _VIEWS and srcs and srcs[0] is not None and srcs[0][0] in from_comm:
                from_comm.add(r.seq)
            elif r.op == "aten.copy_.default" and r.direction == "backward":
                dst, src = _producer(r.inputs.get("self")), _producer(r.inputs.get("src"))
                if dst is not None and src is not None and src[0] in from_comm and r.outputs:
                    found.setdefault(dst[0], {})[dst[1]] = r.outputs[0]
        out.append(found)
    kept = [{r.seq for r in recs} for recs in logical]
    return [{s: v for s, v in f.items() if s in k} for f, k in zip(out, kept)]


def _producer(meta: Any) -> tuple[int, int] | None:
    m = re.fullmatch(r"op:(\d+):(\d+)", getattr(meta, "source", None) or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def _replicated_like(group: list[Record], bench: Record | None) -> bool:
    """A backward record under data parallelism that holds no rank's own gradient: every output
    the same on every rank, of the single run's shape (a weight's transpose)."""
    if bench is None:
        return False
    bench_out = dict(bench.output_tensors())
    for name, meta in group[0].output_tensors():
        guide = bench_out.get(name)
        if guide is None or tuple(guide.shape) != tuple(meta.shape):
            return False
        others = [dict(r.output_tensors()).get(name) for r in group[1:]]
        if any(o is None for o in others) or not _same_values([meta, *others]):
            return False
    return True


def _with_outputs(rec: Record, replaced: dict[int, TensorMeta]) -> list:
    outs = list(rec.outputs)
    for k, meta in replaced.items():
        if k < len(outs):
            outs[k] = replace(meta, source=None)
    return outs


# -- tensors ---------------------------------------------------------------------------------------


def _map_tensors(value: Any, values: list[Any], prefix: str, guides: dict[str, TensorMeta], rebuild,
                 keyed: bool = False) -> Any:
    """``value`` with each tensor replaced by ``rebuild(name, [each rank's], single run's)``."""
    if keyed:
        return {k: _map_tensors(v, [vs.get(k) for vs in values], k, guides, rebuild) for k, v in value.items()}
    if isinstance(value, TensorMeta):
        metas = [v if isinstance(v, TensorMeta) else None for v in values]
        if any(m is None for m in metas):
            return replace(value, stats=None, data=None, sharding=None, note="not a tensor on every rank")
        return rebuild(prefix, metas, guides.get(prefix))
    if isinstance(value, (list, tuple)):
        items = [_map_tensors(v, [vs[i] if isinstance(vs, (list, tuple)) and i < len(vs) else None for vs in values],
                              f"{prefix}.{i}", guides, rebuild) for i, v in enumerate(value)]
        return type(value)(items) if isinstance(value, tuple) else items
    return value


def _with_kernel_data(meta: TensorMeta, name: str, kernels: list[Record]) -> TensorMeta:
    """A DTensor record's tensor with the saved data of the same tensor in its local kernel (the
    same op on the shards: same name, shape and statistics); DTensor records save none."""
    if meta.sharding is None or meta.data is not None or not kernels:
        return meta
    for k in reversed(kernels):
        for kname, km in (*k.input_tensors(), *k.output_tensors()):
            if kname == name and km.data is not None and tuple(km.shape) == tuple(meta.shape) and km.stats == meta.stats:
                return replace(meta, data=km.data)
    return meta


def _by_placements(metas: list[TensorMeta], guide: TensorMeta | None = None) -> Assembly | str:
    """A DTensor's assembly from its placements. A replicated DTensor whose ranks' copies
    disagree is replicated work that went wrong on some rank: the copy farthest from the single
    run stands for it (``_farthest``), as for a plain tensor, not the first coordinate's."""
    sh = [m.sharding for m in metas]
    if any(s is None for s in sh) or len({(s.placements, s.global_shape, s.mesh) for s in sh}) != 1:
        return "the ranks describe this DTensor differently: not rebuilt"
    first = sh[0]
    how = "shard"
    for p in first.placements:
        if p.startswith("_S("):
            return f"strided sharding {p} is not rebuilt"
        if p.startswith("P("):
            op = p[2:-1]
            if op not in ("sum", "avg"):
                return f"a partial {op} is not rebuilt"
            how = op
    replicated = [i for i, p in enumerate(first.placements) if p == "R"]
    parts = [Part(r, m, tuple(s.global_offset)) for r, (m, s) in enumerate(zip(metas, sh))
             if all(s.coordinate[i] == 0 for i in replicated)]
    if how == "shard" and len(parts) == 1 and tuple(parts[0].meta.shape) == tuple(first.global_shape):
        how = "copy"
        if guide is not None and all(p == "R" for p in first.placements) and not _same_values(metas):
            zero = (0,) * len(first.global_shape)
            return Assembly("replicas", tuple(first.global_shape), metas[0].dtype,
                            [Part(r, m, zero) for r, m in enumerate(metas)], pick=_farthest(metas, guide))
    return Assembly(how, tuple(first.global_shape), metas[0].dtype, parts)


def _scalars(a: Assembly) -> list[float] | None:
    """The parts' values, where each part is one element whose statistics give it (min == max)."""
    values = []
    for p in a.parts:
        st = p.meta.stats
        if p.meta.numel != 1 or st is None or st.min is None or st.min != st.max:
            return None
        values.append(float(st.min))
    return values


def _over_the_batch(rec: Record, source: Assembly | None) -> str | None:
    """"sum" or "avg" where ``rec`` reduces a whole tensor that the ranks hold in equal slices
    (``source``: its input's assembly, a shard): each rank's sum (mean) of its slice is one term of
    the whole's, as data parallelism's per-rank loss, the mean of each rank's own batch, is one
    term of the single run's mean."""
    if source is None or source.how != "shard" or len(source.parts) < 2:
        return None
    if rec.op == "aten.sum.default":
        return "sum"
    if rec.op == "aten.mean.default" and len({p.meta.numel for p in source.parts}) == 1:
        return "avg"
    return None


def _farthest(metas: list[TensorMeta], guide: TensorMeta) -> int:
    """Which rank's copy of a value every rank computes alike (tensor parallelism's replicated
    work: norms, residual adds) stands for it, when the ranks disagree: the one farthest from
    the single run's (by sample, else statistics), so that the row fails if any rank's copy is
    wrong; which rank that is, ``blame_ranks`` says."""
    def distance(m: TensorMeta) -> float:
        a, b = m.stats, guide.stats
        if a is None or b is None:
            return 0.0
        if a.sample and b.sample and len(a.sample) == len(b.sample):
            return max((abs(x - y) for x, y in zip(a.sample, b.sample) if x == x and y == y), default=0.0)
        return sum(abs((x or 0.0) - (y or 0.0)) for x, y in ((a.mean, b.mean), (a.std, b.std), (a.min, b.min),
                                                               (a.max, b.max)))
    return max(range(len(metas)), key=lambda r: distance(metas[r]))


def _partial_size(a: Assembly) -> int:
    sh = a.parts[0].meta.sharding
    return math.prod(n for n, p in zip(sh.mesh, sh.placements) if p.startswith("P(")) if sh else len(a.parts)


def _split_dim(shapes: list[tuple[int, ...]], whole: tuple[int, ...]) -> int | None:
    """The one dimension along which ``shapes`` (in rank order) join into ``whole``."""
    if any(len(s) != len(whole) for s in shapes):
        return None
    found = None
    for d in range(len(whole)):
        sizes = [s[d] for s in shapes]
        if all(n == whole[d] for n in sizes):
            continue
        if sum(sizes) != whole[d] or found is not None:
            return None
        found = d
    return found


def _same_values(metas: list[TensorMeta]) -> bool:
    """Whether the ranks' tensors hold the same values, as far as their records tell (statistics
    and sample; both bit for bit)."""
    first = metas[0]
    if first.stats is None:
        return False
    return all(m.stats is not None and m.stats == first.stats and m.sample == first.sample
               and tuple(m.shape) == tuple(first.shape) for m in metas[1:])


def combined_stats(parts: list[Stats | None]) -> Stats | None:
    """Statistics of the concatenation of disjoint shards, from theirs: min and max exactly, mean
    and (population) std weighted by each shard's finite elements; no sample."""
    if not parts or any(p is None for p in parts):
        return None
    finite = [(p, p.numel - p.nan - p.posinf - p.neginf) for p in parts]
    n = sum(k for _, k in finite)
    out = Stats(None, None, None, None, sum(p.nan for p in parts), sum(p.posinf for p in parts),
                sum(p.neginf for p in parts), sum(p.numel for p in parts))
    live = [(p, k) for p, k in finite if k > 0 and p.mean is not None and p.std is not None]
    if n == 0 or len(live) != len([1 for _, k in finite if k > 0]):
        return out
    out.min = min(p.min for p, _ in live)
    out.max = max(p.max for p, _ in live)
    mean = sum(p.mean * k for p, k in live) / n
    second = sum((p.std ** 2 + p.mean ** 2) * k for p, k in live) / n
    out.mean, out.std = mean, math.sqrt(max(second - mean * mean, 0.0))
    return out


def _rms(stats: Stats | None) -> float | None:
    if stats is None or stats.mean is None or stats.std is None:
        return None
    return math.sqrt(stats.mean ** 2 + stats.std ** 2)


def _divided(stats: Stats | None, per: int) -> Stats | None:
    if stats is None or per == 1 or stats.mean is None:
        return stats
    return replace(stats, min=stats.min / per, max=stats.max / per, mean=stats.mean / per, std=stats.std / per,
                   sample=None)


def _merged_summary(labels: list[str], ranks: list[Any]) -> dict:
    """One summary for the ranks: the first stop any rank recorded, the backward calls none
    recorded."""
    out: dict[str, Any] = {}
    unrecorded = 0
    for label, d in zip(labels, ranks):
        s = getattr(d, "summary", None) or {}
        if not isinstance(s, dict):
            continue
        if "stopped" not in out and isinstance(s.get("stopped"), dict):
            out["stopped"] = dict(s["stopped"], reason=f"{label}: {s['stopped'].get('reason') or ''}")
        try:
            unrecorded = max(unrecorded, int(((s.get("unrecorded") or {}).get("backward_calls")) or 0))
        except (TypeError, ValueError, AttributeError):
            pass
    if unrecorded:
        out["unrecorded"] = {"backward_calls": unrecorded}
    return out


# -- which rank ------------------------------------------------------------------------------------


def blame_ranks(rows: list, run: UnshardedRun, single: Any, side: str = "target") -> None:
    """Name the rank a failing or warning row's error sits in: each rank's shard of the rebuilt
    tensor against the single run's slice of it (both saved), else, for a failing row, each
    rank's call recomputed on its own inputs (``_blame_by_recomputing``: a partial sum has no
    slice to compare with; a value compared through a layout change has no aligned one). A row
    whose error is in some ranks' shards only gets ``rank`` set to them, and its note says each
    shard's error."""
    from .result import PairStatus

    judged = (PairStatus.FAIL.value, PairStatus.WARNING.value, PairStatus.NAN_INF.value)
    bench_records: dict[int, Record] = {}
    for row in rows:  # records kept only to pair: skipped, with the reason
        seq = row.target_seq if side == "target" else row.bench_seq
        why = run.found.skipped.get((seq, row.tensor)) if seq is not None else None
        if why is not None and row.status != PairStatus.UNMATCHED.value:
            row.status, row.note = PairStatus.SKIP.value, why
    for row in rows:
        if row.status not in judged or row.target_seq is None or row.bench_seq is None:
            continue
        seq, single_seq = (row.target_seq, row.bench_seq) if side == "target" else (row.bench_seq, row.target_seq)
        a = run.found.assemblies.get((seq, row.tensor))
        if a is None:
            continue
        if a.how in ("shard", "replicas") and len(a.parts) > 1 and not row.layout:
            if not bench_records:
                bench_records.update({r.seq: r for r in single.records})
            _blame_by_shards(row, run, single, bench_records.get(single_seq), a)
        if not row.rank and row.status == PairStatus.FAIL.value and (a.how in ("sum", "avg") or len(a.parts) > 1):
            _blame_by_recomputing(row, run, seq)


def _blame_by_shards(row: Any, run: UnshardedRun, single: Any, brec: Record | None, a: Assembly) -> None:
    """Each rank's shard (or copy) of the rebuilt tensor against the single run's slice of it."""
    bmeta = dict(brec.output_tensors()).get(row.tensor) if brec is not None else None
    if bmeta is None or bmeta.data is None or any(p.meta.data is None for p in a.parts):
        return
    try:
        whole = single.load_tensor(bmeta).reshape(a.shape).to(torch.float64)
        errs = []
        scale = float(whole.abs().max()) or 1.0
        for p in a.parts:
            t = run.ranks[p.rank].load_tensor(p.meta).reshape(p.meta.shape).to(torch.float64) / a.per
            region = whole[tuple(slice(o, o + n) for o, n in zip(p.offset, t.shape))]
            errs.append(float((t - region).abs().max()) / scale if t.numel() else 0.0)
    except (KeyError, OSError, ValueError, RuntimeError):
        return
    worst = max(errs)
    if worst <= 0:
        return
    wrong = [run.labels[p.rank] for p, e in zip(a.parts, errs) if e >= 0.5 * worst]
    right = [e for e in errs if e < 0.5 * worst]
    per = ", ".join(f"{run.labels[p.rank]} {e:.3g}" for p, e in zip(a.parts, errs))
    row.note = "; ".join(x for x in (row.note, f"error by rank's shard: {per}") if x)
    if right and max(right) <= 0.1 * worst:
        row.rank = ",".join(wrong)


def _blame_by_recomputing(row: Any, run: UnshardedRun, seq: int) -> None:
    """A failing partial sum (a weight's gradient under data parallelism, a row-parallel
    matmul) has no slice of the single run to compare each rank's term with: each rank's call is
    recomputed on its own saved inputs instead (``UnshardedRun.rank_local_errors``), and a rank
    whose output is off its own inputs where the others' are not is the row's rank."""
    m = re.fullmatch(r"out(\d+)", row.tensor or "")
    found = run.rank_local_errors(seq, int(m.group(1)), steps=False) if m is not None else None
    if found is None:
        return
    errs = [le.local for le in found]
    worst = max(errs)
    if worst <= 0:
        return
    per = ", ".join(f"{label} {e:.3g}" for label, e in zip(run.labels, errs))
    row.note = "; ".join(x for x in (row.note, f"each rank's call recomputed on its own inputs: {per}") if x)
    right = [e for e in errs if e < 0.5 * worst]
    if right and max(right) <= 0.1 * worst:
        row.rank = ",".join(label for label, e in zip(run.labels, errs) if e >= 0.5 * worst)
