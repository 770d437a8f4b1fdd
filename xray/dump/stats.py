"""Tensor statistics: min, max, mean, std over finite elements plus NaN/Inf counts.

Must be called with every dispatch mode disabled (the tracer does that); it never mutates its
input, so recording cannot change the model's numbers.

CPU tensors (contiguous or strided) of float32, float64, bfloat16, the integer types and bool are reduced in
ONE pass by the optional C extension ``xray.dump._moments`` (min, max, sum, sum of squares;
built by ``pip install``, see setup.py) instead of three torch reductions and four ``.item()``
calls (measurements: tools/bench_debugger.py). Everything else, and any tensor holding a NaN
or Inf, takes the torch path. ``NATIVE`` says whether the extension is in use; set
``XRAY_NATIVE_STATS=0`` in the environment (read once, at import) to force the torch path.

``DeferredStats`` is the accelerator path: tensors queued per device, reduced there in batches
into a buffer, read back once per writer flush, not once per tensor (docs/performance.md).
An expanded tensor is reduced over its stored elements (``unexpanded``), on every path.
"""
from __future__ import annotations

import functools
import importlib.util
import math
import os
import warnings
import weakref
from typing import Any, Callable

import torch

from .dispatch_modes import no_dispatch_modes
from .columns import ABSENT_MAX, ABSENT_MEAN, ABSENT_MIN, ABSENT_STD
from .model import Stats
from .samples import SAMPLE_SIZE, as_bytes, as_floats, index as sample_index, offsets_bytes, take

try:
    from . import _moments as _ext
except ImportError:  # no C compiler at install time: torch does it all
    _ext = None

# The plain-C build (compilers without GCC vector extensions) is slower than torch: not used.
NATIVE = (_ext is not None and _ext.ISA != "scalar"
          and os.environ.get("XRAY_NATIVE_STATS", "1").strip().lower() not in ("0", "false", "no", "off"))
_moments = _ext.moments if NATIVE else None
# An extension built before moments_strided existed still serves contiguous tensors.
_moments_strided = getattr(_ext, "moments_strided", lambda *a: None) if NATIVE else None
# An extension built before gather existed: samples by torch.take
_gather = getattr(_ext, "gather", None) if NATIVE else None
# dtype -> the extension's kind; empty when not NATIVE, so the hot path needs no extra flag test
_NATIVE_KINDS = {torch.float32: _ext.FLOAT32, torch.float64: _ext.FLOAT64, torch.bfloat16: _ext.BFLOAT16,
                 torch.int64: _ext.INT64, torch.int32: _ext.INT32, torch.int16: _ext.INT16,
                 torch.int8: _ext.INT8, torch.uint8: _ext.UINT8, torch.bool: _ext.UINT8} if NATIVE else {}
# Subclasses (fake, wrapper, distributed tensors) may have no plain storage behind data_ptr.
_PLAIN_TYPES = frozenset({torch.Tensor, torch.nn.Parameter})
_STRIDED = torch.strided
_TENSOR = torch.Tensor
# Size cap for the native path: one single-threaded pass against torch's three threaded
# reductions, so the crossover depends on torch's thread count (derivation: tools/bench_debugger.py).
_NATIVE_MAX = 1 << 24 if torch.get_num_threads() <= 4 else 1 << 18

_FLOATING_UPCAST = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


def _as_real(t: torch.Tensor) -> torch.Tensor:
    if t.is_complex():
        return torch.view_as_real(t.resolve_conj())
    if t.dtype == torch.bool:
        return t.to(torch.uint8)
    if t.dtype in _FLOATING_UPCAST:
        return t.to(_FLOATING_UPCAST[t.dtype])
    if not t.is_floating_point():
        return t.to(torch.float64)
    if t.dtype not in (torch.float32, torch.float64):  # float8 and friends
        return t.to(torch.float32)
    return t


_FAST_DTYPES = frozenset({torch.float32, torch.float64})


def tensor_stats(t: torch.Tensor, *, native: bool = True) -> Stats:
    """Statistics of ``t``. Fast path (every element finite, the common case): min/max, sum and
    sum of squares in one native pass (CPU) or three torch reductions and one host transfer,
    mean and std from those. ``native=False`` forces the torch path (tests, benchmarks)."""
    return Stats(*_reduce(t, native), sample=as_floats(sample_bytes(t, native)))


def stats_row(t: torch.Tensor) -> tuple:
    """``t``'s statistics as the index's tensor-row cells (``row_of_stats``), for the recorder's
    row path: no ``Stats`` object is made, and the tuple of numbers costs the garbage collector
    nothing once it has been seen. The eleventh cell is the sample (``sample_bytes``)."""
    lo, hi, mean, std, nan, posinf, neginf, n = _reduce(t, True)
    sample = sample_bytes(t)
    if lo is not None and mean is not None and std is not None and hi is not None:
        return (1, 0, lo, hi, mean, std, nan, posinf, neginf, n, sample)
    return row_of_stats(Stats(lo, hi, mean, std, nan, posinf, neginf, n, as_floats(sample)))


def row_of_stats(st: Stats | None) -> tuple:
    """(has_stats, absent, min, max, mean, std, nan, posinf, neginf, numel[, sample]): the
    tensor-row cells; the sample (float64 bytes) only where ``st`` has one."""
    if st is None:
        return NO_STATS
    mn, mx, mean, std = st.min, st.max, st.mean, st.std
    absent = ((mn is None) * ABSENT_MIN | (mx is None) * ABSENT_MAX
              | (mean is None) * ABSENT_MEAN | (std is None) * ABSENT_STD)
    cells = (1, absent, 0.0 if mn is None else mn, 0.0 if mx is None else mx,
             0.0 if mean is None else mean, 0.0 if std is None else std, st.nan, st.posinf, st.neginf, st.numel)
    return cells if not st.sample else cells + (as_bytes(st.sample),)


def stats_of_row(row: tuple | Stats | None) -> Stats | None:
    """The ``Stats`` behind a cached value of either form (rows and deferred ``Stats`` share a cache)."""
    if row is None or type(row) is not tuple:
        return row
    has, absent, mn, mx, mean, std, nan, posinf, neginf, n = row[:10]
    if not has:
        return None
    return Stats(None if absent & ABSENT_MIN else mn, None if absent & ABSENT_MAX else mx,
                 None if absent & ABSENT_MEAN else mean, None if absent & ABSENT_STD else std,
                 nan, posinf, neginf, n, as_floats(row[10]) if len(row) > 10 else None)


NO_STATS = (0, 0, 0.0, 0.0, 0.0, 0.0, 0, 0, 0, 0)  # no statistics, so no sample either


def norm_of(stats: tuple | Stats | None) -> float | None:
    """The Frobenius norm a tensor's statistics imply (``sqrt(n (std^2 + mean^2))``: std is the
    population's), or None where they cannot give it: none, or a NaN or Inf among the elements.
    A self-check takes it instead of reading the output once more."""
    if type(stats) is tuple:  # a row: (has, absent, min, max, mean, std, nan, posinf, neginf, numel, ...)
        has, absent, _, _, mean, std, nan, posinf, neginf, n = stats[:10]
        if not has or absent & (ABSENT_MEAN | ABSENT_STD) or nan or posinf or neginf:
            return None
    elif stats is None or stats.mean is None or stats.std is None or stats.nan or stats.posinf or stats.neginf:
        return None
    else:
        mean, std, n = stats.mean, stats.std, stats.numel
    return math.sqrt(n * (std * std + mean * mean))


def sample_bytes(t: torch.Tensor, native: bool = True) -> bytes | None:
    """``t``'s sample (xray/dump/samples.py) as float64 bytes, None where it has none (empty, or a
    tensor no gather reads). CPU tensors of the native kinds: the C gather at the storage offsets
    cached per shape and stride (a few hundred ns); the rest: one ``torch.take`` on ``t``'s device."""
    kind = _NATIVE_KINDS.get(t.dtype) if native and _gather is not None else None
    if (kind is not None and type(t) in _PLAIN_TYPES and t.is_cpu and t.layout is _STRIDED
            and not t.is_neg()):
        try:  # the extension only reads the memory; t keeps it alive during the call
            return _gather(t.data_ptr(), kind, offsets_bytes(t.shape, t.stride())) or None
        except (RuntimeError, ValueError):  # no storage behind it: torch says
            pass
    if t.layout is not _STRIDED or t.is_meta or t.numel() == 0:
        return None
    try:
        return take(t).tobytes() or None
    except Exception:  # noqa: BLE001 - a subclass or layout take does not read: no sample
        return None


def resampled(value: Any, t: torch.Tensor) -> Any:
    """A cached value (cells or ``Stats``) described for another tensor with the same elements
    (an op that keeps its input's values, ``info.stats_preserving``), given ``t``'s own sample:
    a reshape or transpose holds the same values at other logical positions, and a tensor's
    sample is drawn at its own shape's positions."""
    if type(value) is tuple:
        if len(value) <= 10:
            return value
        return value[:10] + (sample_bytes(t),)
    if type(value) is Stats and value.sample is not None:
        return Stats(value.min, value.max, value.mean, value.std, value.nan, value.posinf, value.neginf,
                     value.numel, as_floats(sample_bytes(t)))
    return value


def _reduce(t: torch.Tensor, native: bool) -> tuple:
    """(min, max, mean, std, nan, posinf, neginf, numel); None where there is no finite element.
    The recorder's C path (xray/record/_fastpath.c, native_stats) repeats the all-finite branch
    operation for operation: a change to it is a change there too."""
    n = t.numel()
    reals = n  # the values reduced: 2n for a complex tensor (its real and imaginary parts)
    x = None  # the tensor the torch reductions below read; None after the native pass
    sums = _native_moments(t, n) if native else None
    if sums is not None:
        lo, hi, total, sq = sums
    else:
        if n == 0 or t.layout != torch.strided or t.is_meta:
            return (None, None, None, None, 0, 0, 0, n)
        if 0 in t.stride() and any(st == 0 and sz > 1 for sz, st in zip(t.shape, t.stride())):
            return _expanded(t, n, native)
        # float32/float64 (nearly every activation) skip the dtype ladder
        if t.dtype in _FAST_DTYPES:
            x = t.detach()
        else:
            x = _as_real(t.detach())
            reals = x.numel()
        if x.dtype == torch.uint8:
            x = x.to(torch.float32)
        mn, mx = torch.aminmax(x)
        if x.is_contiguous():
            flat = x.view(-1)
            squares = torch.dot(flat, flat)  # BLAS, no temporary
        else:  # no copy for strided views: the norm kernel walks any layout
            squares = torch.linalg.vector_norm(x).square()
        if x.device.type == "cpu":  # four item() calls are cheaper than a stack kernel plus tolist
            lo, hi, total, sq = mn.item(), mx.item(), x.sum().item(), squares.item()
        else:  # one device-to-host transfer instead of four synchronisations
            lo, hi, total, sq = torch.stack([mn, mx, x.sum(), squares]).tolist()
    # All finite (inlined _finite: this is the hot path). torch's aminmax propagates NaN; the
    # native pass skips NaN in min/max, but a NaN or Inf anywhere makes the sum non-finite.
    if lo - lo == 0.0 and hi - hi == 0.0 and total - total == 0.0:
        if lo == hi:  # constant (or one element): exact without any arithmetic
            return (lo, hi, lo, 0.0, 0, 0, 0, n)
        mean = total / reals
        var = sq / reals - mean * mean
        # E[x^2] - mean^2 loses digits when |mean| >> std (or overflows): then take the exact
        # two-pass formula (torch.std_mean's Welford kernel is much slower on CPU).
        if var - var == 0.0 and var > 1e-3 * mean * mean:
            return (lo, hi, mean, var ** 0.5, 0, 0, 0, n)
        mean, std = _two_pass(_as_real(t.detach()) if x is None else x)
        return (lo, hi, mean, std, 0, 0, 0, n)
    # Slow path: some element is NaN or +-Inf (or the sum overflowed). Count them and take the
    # rest's statistics.
    if x is None:
        x = _as_real(t.detach())
    nan = int(torch.isnan(x).sum())
    posinf = int(torch.isposinf(x).sum())
    neginf = int(torch.isneginf(x).sum())
    finite = x[torch.isfinite(x)]
    if finite.numel() == 0:
        return (None, None, None, None, nan, posinf, neginf, n)
    mn, mx = torch.aminmax(finite)
    mean, std = _two_pass(finite)
    return (float(mn), float(mx), mean, std, nan, posinf, neginf, n)


def unexpanded(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(the tensor without its broadcast dims, how often each of its elements repeats in ``t``).
    An ``expand`` repeats every element equally often, so min, max, mean and the population std
    are the distinct elements', and the NaN/Inf counts scale by the repeat: a (2**20, 2**20, 4096)
    expand of one value is reduced in one element, not 2**52."""
    sizes = [1 if st == 0 else sz for sz, st in zip(t.shape, t.stride())]
    base = t.as_strided(sizes, t.stride(), t.storage_offset())
    return base, t.numel() // max(base.numel(), 1)


def _expanded(t: torch.Tensor, n: int, native: bool) -> tuple:
    base, repeat = unexpanded(t)
    lo, hi, mean, std, nan, posinf, neginf, _ = _reduce(base, native)
    return (lo, hi, mean, std, nan * repeat, posinf * repeat, neginf * repeat, n)


def _native_moments(t: torch.Tensor, n: int) -> tuple[float, float, float, float] | None:
    """(min, max, sum, sum of squares) from the extension's one pass, or None where it does not
    apply: no extension, another dtype, too large, empty, not plain contiguous CPU memory."""
    kind = _NATIVE_KINDS.get(t.dtype)
    if (kind is None or not 0 < n <= _NATIVE_MAX or type(t) not in _PLAIN_TYPES or not t.is_cpu
            or t.layout is not _STRIDED or t.is_neg()):
        return None
    try:  # the extension only reads the memory; t keeps it alive during the call
        if t.is_contiguous():
            return _moments(t.data_ptr(), n, kind)
        # slices, transposes, permuted results: the same pass over the contiguous runs
        return _moments_strided(t.data_ptr(), kind, tuple(t.shape), t.stride())
    except (RuntimeError, ValueError):  # no storage behind it (functorch wrappers), null data
        return None


def _two_pass(x: torch.Tensor) -> tuple[float, float]:
    """Exact population mean and std, in float64."""
    x = x.to(torch.float64)
    m = x.mean()
    return float(m), float(torch.linalg.vector_norm(x - m)) / x.numel() ** 0.5


def _finite(x: float) -> bool:
    return x - x == 0.0  # False for NaN and +-Inf, faster than math.isfinite on hot paths


class StatsCache:
    """Statistics per tensor object and version counter, so each value is reduced once: an op's
    output is the next op's input, q/k/v share one input, parameters persist across steps.

    Keyed by ``id`` with a weak reference that confirms the identity (cheaper than torch's
    WeakIdKeyDictionary), without a callback per tensor: entries of dead tensors are dropped in
    batches, whenever the table has doubled since the last sweep, so memory stays proportional
    to live tensors.

    ``compute`` maps a tensor to what is cached (default: its Stats); the module debugger caches
    the row cells it derives from them too.

    A hit needs the same object, version counter *and* data pointer: ``p.data = t`` and
    FSDP/ZeRO-style storage swaps change a parameter's bytes without moving its version. Writes
    through an alias with its own counter (``p.data.add_()``, EMA updates) change neither, so
    parameters are never trusted across steps: ``keep_parameters=False`` never caches them, and
    the module debugger calls ``forget_parameters`` at each step.

    Caveat: the version counter is bumped by the autograd layer *after* an in-place kernel
    returns, so a dispatch-level caller must ``forget`` a tensor it saw being mutated.

    The recorder's common call in C (xray/record/_fastpath.c) reads and writes ``entries``
    directly, by these same rules (``stamp``, ``describe``, ``put``, ``store`` and the sweep).
    """

    _MIN_SWEEP = 1024  # entries before the first sweep of dead ones

    def __init__(self, compute: Callable[[torch.Tensor], Any] | None = None, *, keep_parameters: bool = True,
                 writes_seen: bool = False) -> None:
        self.compute = tensor_stats if compute is None else compute
        # A value handed on to a tensor with the same elements (an op that keeps its input's
        # values), with that tensor's own sample: ``resampled``, or ``DeferredStats.resample``.
        self.resample: Callable[[Any, torch.Tensor], Any] = resampled
        self._keep_parameters = keep_parameters
        # The owner sees every in-place write and calls forget() for it (the tracer does): then
        # an inference tensor, which has no version counter, is cached until the next write.
        self._writes_seen = writes_seen
        self.writes = 0
        # id(t) -> (weak reference to t, t's version, t's data pointer, value, layout): one flat
        # tuple, as few objects as possible for the garbage collector to count and scan. The
        # recorder's row path keeps t's layout cells beside its statistics (``describe``), so an
        # op's input that was an earlier op's output costs one lookup; None where not known.
        self.entries: dict[int, tuple[weakref.ref, int, int, Any, Any]] = {}
        self._sweep_at = self._MIN_SWEEP

    def stamp(self, t: torch.Tensor) -> int | None:
        """What a cache entry of ``t`` is valid for: its version counter. An inference tensor has
        none (asking raises, at about 6 us): with ``writes_seen`` it gets the count of writes
        seen so far instead, else None (never cached)."""
        if t.is_inference():
            return -1 - self.writes if self._writes_seen else None
        try:
            return t._version
        except RuntimeError:  # no version counter for other reasons (wrapper subclasses)
            return None

    def get(self, t: torch.Tensor) -> Any:
        return self.describe(t)[0]

    def put(self, t: torch.Tensor, value: Any, version: int | None = None) -> None:
        """Cache ``value`` for ``t``; ``version``: the counter ``t`` will have when next asked,
        where it differs from now (a view's output gets its base's counter after the call)."""
        if not self._keep_parameters and type(t) is not _TENSOR and isinstance(t, torch.nn.Parameter):
            return
        if version is None:
            version = self.stamp(t)
            if version is None:
                return
        try:
            ptr = t.data_ptr()
        except RuntimeError:
            return
        # The layout cells of this same tensor stay (a view's output, described a moment ago):
        # shape and strides change only through an in-place op, which forgets the entry.
        old = self.entries.get(id(t))
        layout = old[4] if old is not None and old[2] == ptr and old[0]() is t else None
        self.store(t, version, ptr, value, layout)

    def wrote(self) -> None:
        """Some tensor was (or may have been) written: with ``writes_seen``, no inference tensor's
        entry is trusted any more."""
        self.writes += 1

    def forget(self, t: torch.Tensor) -> None:
        """``t`` was written: drop its entry (and, for ``writes_seen``, every inference tensor's)."""
        self.writes += 1
        hit = self.entries.get(id(t))
        if hit is not None and hit[0]() is t:
            del self.entries[id(t)]

    def forget_all(self, value: Any) -> None:
        """Forget every tensor in ``value``, nested lists included (``c10d.allgather_`` fills a
        ``Tensor[][]``; collectives do not always bump the version counter)."""
        if isinstance(value, torch.Tensor):
            self.forget(value)
        elif isinstance(value, (list, tuple)):
            for v in value:
                self.forget_all(v)

    def __len__(self) -> int:
        return len(self.entries)

    def forget_parameters(self) -> None:
        """Drop every parameter's entry: a new step may have changed them behind their counter."""
        cache = self.entries
        for key in [k for k, hit in cache.items() if isinstance(hit[0](), torch.nn.Parameter)]:
            del cache[key]

    def describe(self, t: torch.Tensor, layout_of: Callable[[torch.Tensor], Any] | None = None) -> tuple[Any, Any]:
        """(value, layout) of ``t``. A hit needs the same object, stamp and data pointer;
        parameters and tensors without a stamp are computed every time. ``layout_of`` (the
        recorder's row path) computes a layout to keep beside the value, first, so that it can
        refuse a tensor that cannot be reduced; without it the layout is None."""
        try:
            version, ptr = self.stamp(t), t.data_ptr()
        except RuntimeError:  # tensors without storage
            version = None
        hit = None if version is None else self.entries.get(id(t))
        if hit is not None and hit[1] == version and hit[2] == ptr and hit[0]() is t:
            layout = hit[4]
            if layout is None and layout_of is not None:
                layout = layout_of(t)
                self.entries[id(t)] = hit[:4] + (layout,)
            return hit[3], layout
        layout = None if layout_of is None else layout_of(t)
        value = self.compute(t)
        # type() first: isinstance against Parameter runs a Python __instancecheck__
        if version is not None and (self._keep_parameters or type(t) is _TENSOR
                                    or not isinstance(t, torch.nn.Parameter)):
            self.store(t, version, ptr, value, layout)
        return value, layout

    def holds(self, t: torch.Tensor) -> bool:
        """An entry exists for this very tensor object (whatever its stamp)."""
        hit = self.entries.get(id(t))
        return hit is not None and hit[0]() is t

    def store(self, t: torch.Tensor, version: int, ptr: int, value: Any, layout: Any = None) -> None:
        """Cache ``value`` (and ``layout``) for ``t`` as of ``version`` and data pointer ``ptr``."""
        # A dead tensor's entry may still sit under a reused id: overwritten here, and never
        # returned meanwhile, since its reference no longer resolves to the asking tensor.
        cache = self.entries
        cache[id(t)] = (weakref.ref(t), version, ptr, value, layout)
        if len(cache) >= self._sweep_at:
            self.sweep()

    def sweep(self) -> None:
        """Drop the entries of dead tensors now (a caller between steps: the module debugger)."""
        cache = self.entries
        for key in [k for k, hit in cache.items() if hit[0]() is None]:
            del cache[key]
        self._sweep_at = max(self._MIN_SWEEP, 2 * len(cache))


# -- deferred statistics: launched on the device, read back once per flush ------------------------
_ROW = 7  # min, max, sum, centred sum of squares, finite count, +inf count, -inf count; then the sample
# then the same positions read again when the batch is reduced: a difference from the sample taken
# at the call means a write the dispatcher did not see reached the tensor before its statistics
_LATE = _ROW + SAMPLE_SIZE


def _launch_row(t: torch.Tensor, row: torch.Tensor) -> None:
    """Write one tensor's statistics into ``row`` (a float64 row of the buffer, on t's device)
    with device kernels only: no branch on a value, so nothing waits for the device.

    Same semantics as tensor_stats: only finite elements enter min/max/mean/std; NaN, +Inf and
    -Inf are counted (NaN = numel - finite - posinf - neginf, at resolve). The mean stays on
    the device and the squares are centred on it: the two-pass std of ``_two_pass``. Sums
    accumulate in float64; temporaries keep the tensor's own (real) dtype, so the transient
    memory is a few copies of the tensor, never float64 ones."""
    x = _as_real(t.detach())
    if x.dtype == torch.uint8:
        x = x.to(torch.float32)
    fin = torch.isfinite(x)
    count = fin.sum()
    total = torch.where(fin, x, 0).sum(dtype=torch.float64)
    mean = total / count.clamp(min=1)
    centred = torch.where(fin, x - mean.to(x.dtype), 0)
    m2 = torch.linalg.vector_norm(centred, dtype=torch.float64).square()
    del centred
    lo = torch.where(fin, x, float("inf")).amin().to(torch.float64)
    hi = torch.where(fin, x, float("-inf")).amax().to(torch.float64)
    posinf = torch.isposinf(x).sum()
    neginf = torch.isneginf(x).sum()
    torch.stack([lo, hi, total, m2, count.to(torch.float64), posinf.to(torch.float64),
                 neginf.to(torch.float64)], out=row)


BATCH_ENV = "XRAY_STATS_BATCH"  # "<tensors>,<bytes>": the queue's bounds (read when a DeferredStats is made)
BATCH_DEFAULT = (256, 1 << 30)


def batch_bounds() -> tuple[int, int]:
    """``XRAY_STATS_BATCH`` as (tensors, bytes); the default where unset or unreadable."""
    text = os.environ.get(BATCH_ENV, "").replace(" ", "")
    try:
        count, size = (int(x) for x in text.split(","))
    except ValueError:
        return BATCH_DEFAULT
    return max(1, count), max(1, size)


def _rows_one_by_one(items: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """The portable batch kernel: each tensor's row by ``_launch_row`` (device kernels only)."""
    for x, row in items:
        _launch_row(x, row)


def _fused_rows(items: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """The fused Triton kernel (xray/dump/stats_triton.py: two launches per batch, each byte read
    once), imported at the first batch; ``_rows_one_by_one`` for what it does not take, and for
    everything where triton does not import or ``XRAY_TRITON_STATS=0``."""
    kernel = _rows_one_by_one
    if os.environ.get("XRAY_TRITON_STATS", "1").strip().lower() not in ("0", "false", "no", "off"):
        try:
            from . import stats_triton
            kernel = functools.partial(stats_triton.fused_rows, fallback=_rows_one_by_one)
        except Exception:  # noqa: BLE001 - no triton, or one without this device's backend
            pass
    try:
        kernel(items)
    except Exception as e:  # noqa: BLE001 - the first compile failed (a device triton does not target)
        # said once, so a benchmark or a device check never reports the fallback's cost as the kernel's
        warnings.warn(f"xray: the fused Triton statistics kernel failed ({type(e).__name__}: "
                      f"{str(e).splitlines()[0][:200] if str(e) else ''}); statistics are taken per tensor, "
                      "about fifteen kernel launches each (XRAY_TRITON_STATS=0 silences this)", RuntimeWarning,
                      stacklevel=2)
        kernel = _rows_one_by_one
        kernel(items)
    for device_type in TRITON_DEVICE_TYPES:
        if BATCH_KERNELS.get(device_type) is _fused_rows:
            BATCH_KERNELS[device_type] = kernel


# Device types with a Triton backend (cuda covers ROCm too). Registered only where triton is
# installed; the import itself waits for the first batch (it costs about a second).
TRITON_DEVICE_TYPES = ("cuda", "xpu")

# device type -> a kernel that writes the rows of a whole batch at once: [(tensor, row)] -> None.
# A fused multi-tensor kernel (one read of each byte for every statistic) registers here; every
# device type without one takes ``_rows_one_by_one``.
BATCH_KERNELS: dict[str, Callable[[list[tuple[torch.Tensor, torch.Tensor]]], None]] = (
    dict.fromkeys(TRITON_DEVICE_TYPES, _fused_rows) if importlib.util.find_spec("triton") else {})


class DeferredStats:
    """Statistics computed where the tensor lives, in batches, into a preallocated buffer per
    device, and copied to the host once per ``resolve()`` (the writer's flush) instead of once
    per tensor. Works for any device type: only torch ops run on the tensor's own device.
    Each tensor's sample is gathered there too, into the same row of the buffer (after the
    statistics), so it costs no transfer of its own.

    ``launch(t)`` queues ``t`` and returns a ``Stats`` holding only ``numel``. The queue of a
    device is reduced in one batch (``BATCH_KERNELS``) when it reaches ``batch_count`` tensors
    or ``batch_bytes`` bytes (``XRAY_STATS_BATCH``), when a call is about to write a tensor
    (``before_write``: a queued tensor keeps the values it had at its call), and at
    ``resolve()``, which then copies each device's buffer to the host in one transfer and fills
    the handed-out Stats in place, so every record (and cache entry) holding one sees the
    values. A full buffer is resolved early: one more transfer per ``capacity`` tensors.
    ``transfers`` counts the device-to-host copies made, ``batches`` the batches reduced,
    ``launched`` the tensors queued.

    Writes the dispatcher never sees (``.numpy()``, DLPack, raw Triton or extension kernels,
    CUDA-graph replays) can land between a call and its batch. The sample is therefore taken at
    the call, and read again when the batch is reduced; the tensor's version counter is compared
    too. Where either moved, the statistics are not the call's: they are withheld (min, max, mean
    and std absent, counts 0; the sample stays the call's) and ``withheld`` counts them.
    A write to positions outside the sample escapes this check (docs/performance.md).
    """

    def __init__(self, capacity: int = 4096, batch_count: int | None = None, batch_bytes: int | None = None) -> None:
        self.capacity = capacity
        count, size = batch_bounds()
        self.batch_count = batch_count or count
        self.batch_bytes = batch_bytes or size
        self._buffers: dict[torch.device, torch.Tensor] = {}
        # per device: the Stats handed out since the last resolve, how often each one's reduced
        # elements repeat in its tensor (an expand is reduced over its stored values), its
        # sample's length, and whether it only takes a sample (its numbers are another's: resample)
        self._pending: dict[torch.device, list[tuple[Stats, int, int, bool]]] = {}
        # per device: (tensor, row) not reduced yet, and their bytes
        self._queue: dict[torch.device, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        # per device, for the queued tensors, checked at reduction: (the tensor's values, the tensor
        # itself (weakly), its version counter at the call or None, its sample's positions, the row's
        # cells for the second read, the row's index)
        self._checks: dict[torch.device, list[tuple[torch.Tensor, weakref.ref, int | None, torch.Tensor,
                                                    torch.Tensor, int]]] = {}
        # per device: row index -> True (changed since its call) or False (compare the two samples)
        self._verdicts: dict[torch.device, dict[int, bool]] = {}
        self.withheld = 0  # statistics left out: their tensor changed between its call and its batch
        self._warned = False
        # (Stats, the Stats whose numbers it shares): filled at resolve, in order
        self._links: list[tuple[Stats, Stats]] = []
        self._queued_bytes: dict[torch.device, int] = {}
        self.queued = 0  # tensors waiting in every queue
        self.launched = 0  # tensors queued in all
        self.used = False  # launched at least once: the recorder then watches for writes
        # set by the recorder around a call that writes: its inputs are reduced as described,
        # before the call changes them
        self.at_once = False
        self.transfers = 0
        self.batches = 0

    def _row(self, t: torch.Tensor, stats: Stats, repeat: int, sample_only: bool) -> tuple[torch.Tensor, torch.Tensor, int]:
        """A buffer row for ``stats`` on t's device with t's sample gathered into it now, at the
        call; (the row, the sample's positions, the row's index)."""
        device = t.device
        pending = self._pending.setdefault(device, [])
        if len(pending) == self.capacity:
            self._resolve(device)
            pending = self._pending.setdefault(device, [])
        buffer = self._buffers.get(device)
        if buffer is None:
            # never an inference tensor, or rows written outside inference_mode would raise
            with torch.inference_mode(False):
                buffer = self._buffers[device] = torch.empty((self.capacity, _LATE + SAMPLE_SIZE),
                                                             dtype=torch.float64, device=device)
        position = len(pending)
        row = buffer[position]
        index = sample_index(tuple(t.shape), device)
        k = len(index)
        # on t's device and stream, never recorded (a flush may come from inside the recorder's mode)
        with torch.no_grad(), no_dispatch_modes():
            row[_ROW:_ROW + k].copy_(torch.take(t.detach(), index))
        pending.append((stats, repeat, k, sample_only))
        return row, index, position

    def launch(self, t: torch.Tensor) -> Stats:
        n = t.numel()
        if n == 0 or t.layout != torch.strided or t.is_meta or t.is_complex():
            return tensor_stats(t)  # nothing to reduce, or a layout the kernels below do not take
        device = t.device
        x, repeat = unexpanded(t.detach()) if 0 in t.stride() else (t.detach(), 1)
        stats = Stats(None, None, None, None, numel=n)
        row, index, position = self._row(t, stats, repeat, False)
        queue = self._queue.setdefault(device, [])
        queue.append((x, row[:_ROW]))
        self.queued += 1
        self.launched += 1
        self.used = True
        size = self._queued_bytes[device] = self._queued_bytes.get(device, 0) + x.numel() * x.element_size()
        if self.at_once or len(queue) >= self.batch_count or size >= self.batch_bytes:
            self._reduce_queue(device)  # t among them, read at its call: nothing to check
        else:
            # t's own counter: inside the dispatcher a detached alias gets a fresh one; inference
            # tensors have none
            version = None if t.is_inference() else t._version
            self._checks.setdefault(device, []).append(
                (x if repeat == 1 else t.detach(), weakref.ref(t), version, index, row[_LATE:_LATE + len(index)],
                 position))
        return stats

    def resample(self, value: Any, t: torch.Tensor) -> Any:
        """``resampled`` for the recorder's cache, where ``value`` may still be waiting here: a
        new Stats sharing its numbers (copied at resolve) with t's own sample gathered on t's
        device, so handing statistics on to a view costs no transfer either."""
        if (type(value) is not Stats or value.numel == 0 or type(t) not in _PLAIN_TYPES
                or t.layout != torch.strided or t.is_meta or t.is_complex() or t.numel() != value.numel):
            return resampled(value, t)
        stats = Stats(value.min, value.max, value.mean, value.std, value.nan, value.posinf, value.neginf,
                      value.numel)
        self._row(t, stats, 1, True)  # the sample is read now; the numbers are value's, checked there
        self._links.append((stats, value))
        self.used = True
        return stats

    def before_write(self) -> None:
        """A call is about to write some tensor: reduce every queued one first, on its device
        (no host transfer), so none is read after it changed."""
        for device in list(self._queue):
            self._reduce_queue(device)

    def _reduce_queue(self, device: torch.device) -> None:
        checks = self._checks.pop(device, None)
        if checks:
            # each queued tensor's sample read again, just before the batch reads the tensor: on
            # the same stream, so a difference is a write that landed between its call and now
            verdicts = self._verdicts.setdefault(device, {})
            with torch.no_grad(), no_dispatch_modes():
                for src, ref, version, index, cells, position in checks:
                    t = ref()  # dead: only an alias can still write, and the sample's read sees that
                    moved = version is not None and t is not None and t._version != version
                    verdicts[position] = moved
                    if not moved:
                        cells.copy_(torch.take(src, index))
        queue = self._queue.pop(device, None)
        self._queued_bytes.pop(device, None)
        if not queue:
            return
        self.queued -= len(queue)
        self.batches += 1
        with torch.no_grad():  # a parameter's statistics must not join the autograd graph
            BATCH_KERNELS.get(device.type, _rows_one_by_one)(queue)

    def resolve(self) -> None:
        """Reduce what is queued, copy every device's pending rows to the host (one transfer per
        device) and fill in the Stats handed out since the last call."""
        with no_dispatch_modes():  # a flush may come from inside the recorder's own mode: never record this
            for device in list(self._pending):
                self._resolve(device)
        links, self._links = self._links, []
        for s, base in links:  # every device resolved: the numbers a resample shares are in
            s.min, s.max, s.mean, s.std = base.min, base.max, base.mean, base.std
            s.nan, s.posinf, s.neginf = base.nan, base.posinf, base.neginf
        if self.withheld and not self._warned:
            self._warned = True
            warnings.warn(f"xray: {self.withheld} tensor(s) changed between their call and their deferred "
                          "statistics, by a write the dispatcher did not see (.numpy(), DLPack, a raw Triton or "
                          "extension kernel, a CUDA graph replay); their min/max/mean/std are left out of the dump "
                          "(their samples are the call's). XRAY_STATS_BATCH=1,1 takes statistics at each call; "
                          "XRAY_DEFERRED_STATS=0 takes them synchronously (docs/performance.md)",
                          RuntimeWarning, stacklevel=2)

    def _resolve(self, device: torch.device) -> None:
        self._reduce_queue(device)
        pending = self._pending.pop(device, None)
        if not pending:
            return
        verdicts = self._verdicts.pop(device, {})
        rows = self._buffers[device][:len(pending)].tolist()  # the one device-to-host copy
        self.transfers += 1
        for position, ((s, repeat, n, sample_only), row) in enumerate(zip(pending, rows)):
            s.sample = tuple(row[_ROW:_ROW + n]) if n else None
            if sample_only:
                continue
            moved = verdicts.get(position)
            if moved is not None and (moved or _differ(row[_ROW:_ROW + n], row[_LATE:_LATE + n])):
                s.min = s.max = s.mean = s.std = None  # not the call's values: withheld, as absent
                s.nan = s.posinf = s.neginf = 0
                self.withheld += 1
                continue
            lo, hi, total, m2, count, posinf, neginf = row[:_ROW]
            k = int(count)
            s.posinf, s.neginf = int(posinf) * repeat, int(neginf) * repeat
            s.nan = s.numel - k * repeat - s.posinf - s.neginf
            if k == 0:
                continue
            if lo == hi:  # constant: exact, as tensor_stats gives it
                s.min = s.max = s.mean = lo
                s.std = 0.0
            else:
                s.min, s.max, s.mean, s.std = lo, hi, total / k, (m2 / k) ** 0.5


def _differ(early: list[float], late: list[float]) -> bool:
    """The two reads of a sample differ (a NaN read twice is no change)."""
    return any(a != b and (a == a or b == b) for a, b in zip(early, late))
