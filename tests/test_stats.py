"""tensor_stats: the native one-pass path (xray.dump._moments) against the torch path and exact
float64 references; non-finite counting, tails, fallbacks, and that the extension really is built."""
from __future__ import annotations

import importlib
import math
import os
import platform
import shutil
import subprocess
import sys
import sysconfig

import pytest
import torch

from xray.dump import stats
from xray.dump.stats import tensor_stats

# Native float32/bfloat16 sums: float32 lanes of at most 2*CHUNK = 128 terms each, flushed into
# double. Recursive summation of k terms errs by at most (k-1)*u*sum|x| (u = 2^-24), so the sum
# is within 127*2^-24 ~ 7.6e-6 of sum|x| (typically ~sqrt(128)*u ~ 7e-7); float64 errs ~1e-14.
NATIVE_TOL = 1e-5
# The torch path sums in float32 too (cascade sum; BLAS sdot with float32 lanes over n/8 terms):
# typically ~sqrt(n)*u, i.e. ~6e-5 at 1M elements. Native vs torch allows both errors.
TORCH_TOL = 1e-4
SIZES = [1, 7, 8, 9, 513, 65536 + 3, 1 << 20]
DTYPES = [torch.float32, torch.float64, torch.bfloat16]

needs_native = pytest.mark.skipif(not stats.NATIVE,
                                  reason="xray.dump._moments not built, or XRAY_NATIVE_STATS=0")


def _exact(t: torch.Tensor) -> tuple[float, float, float, float, float]:
    """min, max, mean, std (population) and mean(|x|), in float64 from the same values."""
    x = t.detach().double().flatten()
    return x.min().item(), x.max().item(), x.mean().item(), x.std(correction=0).item(), x.abs().mean().item()


def _close(s, t: torch.Tensor, tol: float) -> None:
    lo, hi, mean, std, scale = _exact(t)
    assert (s.min, s.max) == (lo, hi)  # min/max are element values: exact on every path
    assert abs(s.mean - mean) <= tol * scale, (s.mean, mean)  # relative to mean|x|: mean may be ~0
    assert abs(s.std - std) <= tol * std + 1e-300, (s.std, std)


def _randn(n: int, dtype: torch.dtype) -> torch.Tensor:
    return (torch.randn(n, dtype=torch.float64) * 3 + 0.5).to(dtype)


def _have_c_compiler() -> bool:
    cc = (sysconfig.get_config_var("CC") or "").split()
    return bool(cc and shutil.which(cc[0])) or shutil.which("cc") is not None


def test_extension_is_built():
    """CI notices a silently broken build: setup.py marks the extensions optional."""
    if not _have_c_compiler():
        pytest.skip("no C compiler here, so pip install left xray on the torch statistics path")
    ext = importlib.import_module("xray.dump._moments")
    importlib.import_module("xray.dump._pack")  # the writer's conversion of cells into columns
    importlib.import_module("xray.record._fastpath")  # the recorder's common call
    assert ext.ISA in ("avx512", "avx2", "vec16", "scalar")
    if sys.platform != "win32":  # GCC/Clang build the vector kernels, which stats then uses
        assert ext.ISA != "scalar"
        assert stats.NATIVE or os.environ.get("XRAY_NATIVE_STATS") is not None
    if sys.platform == "linux" and platform.machine() == "x86_64":
        with open("/proc/cpuinfo") as f:
            flags = next((line.split() for line in f if line.startswith("flags")), [])
        # the runtime dispatch picks the widest kernels the CPU runs
        widest = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "vec16"
        assert ext.ISA == widest


@pytest.mark.slow
def test_env_var_forces_the_torch_path():
    code = "from xray.dump import stats as s; print(s.NATIVE, len(s._NATIVE_KINDS))"
    env = dict(os.environ, XRAY_NATIVE_STATS="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "0"]


@needs_native
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_native_matches_torch_path_and_exact(n, dtype):
    t = _randn(n, dtype)
    native, torch_path = tensor_stats(t), tensor_stats(t, native=False)
    _close(native, t, NATIVE_TOL if dtype != torch.float64 else 1e-12)
    assert (native.min, native.max) == (torch_path.min, torch_path.max)
    _, _, _, std, scale = _exact(t)
    assert abs(native.mean - torch_path.mean) <= TORCH_TOL * scale
    assert abs(native.std - torch_path.std) <= TORCH_TOL * std
    assert (native.numel, native.nan, native.posinf, native.neginf) == (n, 0, 0, 0)


INT_DTYPES = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool]


@needs_native
@pytest.mark.parametrize("dtype", INT_DTYPES)
@pytest.mark.parametrize("n", [1, 7, 256, 4097])
def test_native_integers_match_the_torch_path(n, dtype):
    """Integer and bool tensors (token ids, positions, masks) take the native pass too, in
    double as the torch path's float64 copy does: min/max exact, mean/std to rounding. The
    extremes of each type sit at both ends, so a narrowing conversion would show."""
    assert stats._NATIVE_KINDS.get(dtype) is not None
    if dtype == torch.bool:
        t = torch.rand(n) < 0.3
    else:
        info = torch.iinfo(dtype)
        lo, hi = (max(info.min, -2**40), min(info.max, 2**40))
        t = torch.randint(lo, hi, (n,), dtype=dtype)
        t[0], t[-1] = lo, hi
    native, torch_path = tensor_stats(t), tensor_stats(t, native=False)
    _close(native, t, 1e-12)
    assert (native.min, native.max, native.numel) == (torch_path.min, torch_path.max, n)
    _, _, _, std, scale = _exact(t)
    assert abs(native.mean - torch_path.mean) <= 1e-12 * scale
    assert abs(native.std - torch_path.std) <= 1e-12 * std + 1e-300


@needs_native
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 9, 17, 33, 513, 65536 + 3])
def test_raw_kernel_tails(n, dtype):
    """Every element counts, the vector body and the scalar tail alike (n not a multiple of
    any vector step): a lone extreme at each position must show in min/max."""
    ext = importlib.import_module("xray.dump._moments")
    kind = {torch.float32: ext.FLOAT32, torch.float64: ext.FLOAT64, torch.bfloat16: ext.BFLOAT16}[dtype]
    for pos in sorted({0, n // 2, n - 1}):
        t = torch.rand(n, dtype=torch.float64).to(dtype)
        t[pos] = -7.0
        lo, hi, total, sq = ext.moments(t.data_ptr(), n, kind)
        x = t.double()
        assert lo == -7.0 and hi == x.max().item()
        assert abs(total - x.sum().item()) <= NATIVE_TOL * x.abs().sum().item()
        assert abs(sq - (x * x).sum().item()) <= NATIVE_TOL * (x * x).sum().item()
    with pytest.raises(ValueError):
        ext.moments(t.data_ptr(), 0, kind)


@needs_native
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 9, 513, 65536 + 3])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_at_first_middle_last(n, dtype, value):
    ext = importlib.import_module("xray.dump._moments")
    kind = {torch.float32: ext.FLOAT32, torch.float64: ext.FLOAT64, torch.bfloat16: ext.BFLOAT16}[dtype]
    for pos in sorted({0, n // 2, n - 1}):
        t = _randn(n, dtype)
        t[pos] = value
        # the kernel itself: the sum can never miss it, an Inf also shows in min/max
        lo, hi, total, sq = ext.moments(t.data_ptr(), n, kind)
        assert not math.isfinite(total)
        if value == math.inf:
            assert hi == math.inf
        elif value == -math.inf:
            assert lo == -math.inf
        s = tensor_stats(t)
        assert s == tensor_stats(t, native=False)
        assert (s.nan, s.posinf, s.neginf) == (int(math.isnan(value)), int(value == math.inf),
                                               int(value == -math.inf))
        if n == 1:
            assert (s.min, s.max, s.mean, s.std) == (None, None, None, None)
        else:
            rest = torch.cat([t[:pos], t[pos + 1:]])
            _close(s, rest, 1e-12)  # the slow path takes the finite rest in float64


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_nan_and_mixed_non_finite(dtype):
    t = torch.full((1000,), math.nan, dtype=dtype)
    s = tensor_stats(t)
    assert (s.min, s.max, s.mean, s.std, s.nan, s.numel) == (None, None, None, None, 1000, 1000)
    t = _randn(1000, dtype)
    t[3], t[500], t[999] = math.inf, -math.inf, math.nan
    s = tensor_stats(t)
    assert s == tensor_stats(t, native=False) and (s.nan, s.posinf, s.neginf) == (1, 1, 1)


def test_torch_path_dtypes_and_layouts():
    """Non-contiguous, float16, integer and bool tensors go through torch and stay right."""
    base = _randn(64 * 48, torch.float32).reshape(64, 48)
    for t in (base.t(), base[:, ::3], base.to(torch.float16), base.to(torch.float16).t()):
        _close(tensor_stats(t), t, 2e-6)
    i = torch.randint(-1000, 1000, (513,), dtype=torch.int64)
    _close(tensor_stats(i), i, 1e-12)
    b = torch.rand(513) > 0.5
    s = tensor_stats(b)
    assert (s.min, s.max) == (0.0, 1.0) and abs(s.mean - b.double().mean().item()) < 1e-12
    assert tensor_stats(torch.empty(0)) == tensor_stats(torch.empty(0), native=False)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_statistics_are_of_the_real_and_imaginary_parts_together(dtype):
    """docs/format.md: a complex tensor's statistics are its 2n real values'. The fast path
    divided their sum by n: mean x2, std x1.414."""
    torch.manual_seed(0)
    z = torch.complex(torch.randn(4096) + 3.0, torch.randn(4096) * 2.0 + 1.0).to(dtype)
    parts = torch.view_as_real(z).double()
    for t in (z, z.conj(), z[::2], z.view(64, 64).t()):
        ref = torch.view_as_real(t.resolve_conj()).double()
        for native in (True, False):
            s = tensor_stats(t, native=native)
            assert s.numel == t.numel()
            assert s.mean == pytest.approx(ref.mean().item(), rel=1e-5)
            assert s.std == pytest.approx(ref.std(correction=0).item(), rel=1e-5)
            assert (s.min, s.max) == pytest.approx((ref.min().item(), ref.max().item()))
    assert stats.stats_row(z)[4] == pytest.approx(parts.mean().item(), rel=1e-5)  # the recorder's cells


@pytest.mark.parametrize("dtype", DTYPES)
def test_views_offsets_parameters_and_neg_bit(dtype):
    t = _randn(4099, dtype)
    for view in (t[5:], t[5:-3], t.reshape(1, 4099)[:, 1:], t[:1000].view(10, 100)):
        assert view.is_contiguous()
        _close(tensor_stats(view), view, NATIVE_TOL if dtype != torch.float64 else 1e-12)
    p = torch.nn.Parameter(t.clone())
    _close(tensor_stats(p), p, NATIVE_TOL if dtype != torch.float64 else 1e-12)
    neg = torch._neg_view(t)  # memory holds the negations: must not be read raw
    assert neg.is_neg() and tensor_stats(neg).min == -tensor_stats(t).max


def test_large_mean_small_spread_takes_the_two_pass_formula():
    t = (1e4 + 1e-2 * torch.randn(65536 + 3, dtype=torch.float64)).float()
    for native in (True, False):
        s = tensor_stats(t, native=native)
        _, _, mean, std, _ = _exact(t)
        assert abs(s.mean - mean) <= 1e-9 * abs(mean) and abs(s.std - std) <= 1e-6 * std
    c = torch.full((513,), 3.25, dtype=torch.bfloat16)
    assert tensor_stats(c) == tensor_stats(c, native=False)
    assert (tensor_stats(c).mean, tensor_stats(c).std) == (3.25, 0.0)


def test_large_finite_values_that_overflow_the_sums():
    t = torch.tensor([3e38, -3e38, 1e30] * 100, dtype=torch.float32)  # x*x overflows float32
    s = tensor_stats(t)
    assert (s.nan, s.posinf, s.neginf) == (0, 0, 0)
    _close(s, t, 1e-12)


@pytest.mark.parametrize("dtype", DTYPES)
def test_never_mutates(dtype):
    t = _randn(65536 + 3, dtype)
    t[7] = math.nan
    before, version = t.clone(), t._version
    tensor_stats(t)
    tensor_stats(t[100:])
    assert t._version == version and torch.equal(t.nan_to_num(0.0), before.nan_to_num(0.0))
    assert t.isnan().sum() == 1


def test_stats_cache_follows_versions_and_never_serves_a_dead_tensors_entry():
    """Entries are keyed by id; a dead tensor's id is soon reused by a new tensor (CPython hands
    freed ids straight back), which must get its own statistics, never the dead one's."""
    cache = stats.StatsCache()
    t = torch.arange(4.0)
    assert cache.get(t).max == 3.0
    t.add_(10)  # in place: the version counter moves, so the entry is stale
    assert cache.get(t).max == 13.0
    reused = 0
    for i in range(2000):
        old = torch.full((3,), float(i))
        old_id = id(old)
        assert cache.get(old).mean == i
        del old
        new = torch.full((3,), -float(i))
        reused += id(new) == old_id
        assert cache.get(new).mean == -i  # same id, same version 0: only the weak reference tells
    assert reused > 0, "the test never exercised id reuse"


def test_stats_cache_memory_follows_live_tensors():
    """Dead tensors' entries are swept once the table doubles. 3,000 tensors are cached and die;
    1,200 others, alive all along (so none reuses a dead one's id), are cached next: the table
    must shrink to the live ones, not hold 4,200 entries."""
    cache = stats.StatsCache()
    later = [torch.randn(2) for _ in range(1200)]
    doomed = [torch.randn(2) for _ in range(3000)]
    for t in doomed:
        cache.get(t)
    del doomed, t
    for t in later:
        cache.get(t)
    assert len(cache) <= 1200
    assert all(cache.get(t) == tensor_stats(t) for t in later)


def test_stats_cache_custom_compute_is_cached_per_version():
    calls = []
    cache = stats.StatsCache(lambda t: calls.append(1) or float(t.sum()))
    t = torch.ones(3)
    assert cache.get(t) == cache.get(t) == 3.0 and len(calls) == 1
    t.mul_(2)
    assert cache.get(t) == 6.0 and len(calls) == 2
