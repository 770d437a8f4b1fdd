"""The fused Triton statistics kernel (xray/dump/stats_triton.py) under Triton's CPU interpreter.

``TRITON_INTERPRET=1`` must be set before triton is first imported, so tests/conftest.py sets it
(pytest loads it before this module, even for a lone run); it affects nothing else on CPU (only the cuda and xpu batch kernels import
triton). Skipped where triton is not installed.

Tolerances, against the exact reference (float64 two-pass over the finite elements, ``_truth``):
min, max and the NaN/Inf counts are exact (an fp32 min/max is exact, and bf16/fp16 widen exactly).
The mean: each block of the kernel is summed in fp32, with an error of at most d * 2**-24 * sum|x|
where d is the depth of the summation: on a GPU 8 sequential adds per thread plus a 7-level tree
(BLOCK 1024, 4 warps), d = 15; under the interpreter numpy's pairwise sum of BLOCK 8192, d <= 16 + 6.
With d <= 32 the mean is off by at most 1.9e-6 * max|x|; the merges are fp64 (2**-53, negligible).
The std: the centred squares are positive terms summed the same way, relative error <= (d + 2) *
2**-24 on the variance, half that on the std, plus terms of second order in the mean's error.
Both are checked at 4e-6 * max|x|.
Against the immediate path (``tensor_stats``, whose CPU sum is itself fp32), the rule of
tests/test_stats_batched.py: min/max/counts equal, mean and std within 1e-5 * max|x|.
"""
from __future__ import annotations

import functools
import importlib
import os
import subprocess
import sys
import textwrap

import pytest
import numpy as np
import torch

if torch.cuda.is_available():  # the real kernels: tools/device_check.py and tests/test_bench_device.py
    pytest.skip("a CUDA machine runs the compiled kernels, not the interpreter", allow_module_level=True)

pytest.importorskip("triton")
stats_triton = importlib.import_module("xray.dump.stats_triton")
stats_mod = importlib.import_module("xray.dump.stats")
if not stats_triton.INTERPRETED:  # tests/conftest.py sets the flag before anything can import triton
    pytest.fail("triton was imported before TRITON_INTERPRET=1 was set (tests/conftest.py sets it first)",
                pytrace=False)

# The near-limit case overflows fp32 on purpose (the kernel then sums that block in fp64); the
# interpreter's numpy reports the overflow.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
KERNEL_BOUND = 4e-6
IMMEDIATE_BOUND = 1e-5


def _corpus() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(30)
    out = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        name = str(dtype).removeprefix("torch.")

        def add(label, t, dtype=dtype, name=name):
            out.append((f"{name}-{label}", t.to(dtype)))
        add("size1", torch.tensor([2.5]))
        add("odd7", torch.randn(7, generator=g))
        add("past-block", torch.randn(stats_triton.BLOCK + 1, generator=g))
        add("past-chunk", torch.randn(stats_triton.CHUNK * 2 + 3, generator=g) * 5 + 1)
        add("negative", -torch.rand(1001, generator=g) - 0.5)
        add("constant", torch.full((300,), -3.0))
        add("nan-inf", torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), -4.0, float("inf"), 2.0]))
        add("all-nan", torch.full((5,), float("nan")))
        add("only-inf", torch.tensor([float("inf"), -float("inf")]))
        add("offset-mean", 100 + torch.randn(5000, generator=g) * 1e-2)
        add("transposed", torch.randn(70, 50, generator=g).t())  # dense, not contiguous: fused
        add("sliced", torch.randn(40, 60, generator=g)[:, ::3])  # gaps: the fallback
    out.append(("float32-large", torch.randn(2_000_000, generator=g) * 2 - 1))
    out.append(("float32-near-limit", torch.tensor([3e38, 2.9e38, -1e38] * 400)))  # fp32 sums overflow
    out.append(("float32-channels-last", torch.randn(2, 3, 17, 9, generator=g).to(memory_format=torch.channels_last)))
    out.append(("float64", torch.randn(333, generator=g, dtype=torch.float64)))  # the fallback
    return out


CORPUS = _corpus()


def _truth(t: torch.Tensor) -> tuple:
    x = t.to(torch.float64).flatten()
    finite = x[torch.isfinite(x)]
    counts = (int(torch.isnan(x).sum()), int(torch.isposinf(x).sum()), int(torch.isneginf(x).sum()))
    if finite.numel() == 0:
        return (None, None, None, None, *counts)
    mean = finite.mean()
    return (float(finite.min()), float(finite.max()), float(mean),
            float(((finite - mean) ** 2).mean().sqrt()), *counts)


def _fused():
    return functools.partial(stats_triton.fused_rows, fallback=stats_mod._rows_one_by_one)


def _deferred_stats(tensors, kernel, monkeypatch, batch_count=64):
    monkeypatch.setitem(stats_mod.BATCH_KERNELS, "cpu", kernel)
    deferred = stats_mod.DeferredStats(batch_count=batch_count, batch_bytes=1 << 30)
    handles = [deferred.launch(t) for t in tensors]
    deferred.resolve()
    return handles


@pytest.mark.slow
@pytest.mark.parametrize("name,t", CORPUS, ids=[n for n, _ in CORPUS])
def test_every_statistic_matches_the_exact_and_the_immediate_reference(name, t, monkeypatch):
    (got,) = _deferred_stats([t], _fused(), monkeypatch)
    lo, hi, mean, std, nan, posinf, neginf = _truth(t)
    assert (got.min, got.max, got.nan, got.posinf, got.neginf, got.numel) == (lo, hi, nan, posinf, neginf, t.numel())
    immediate = stats_mod.tensor_stats(t, native=False)
    assert (got.min, got.max, got.nan, got.posinf, got.neginf) == (
        immediate.min, immediate.max, immediate.nan, immediate.posinf, immediate.neginf)
    if mean is None:
        assert got.mean is None and got.std is None and immediate.mean is None
        return
    scale = max(abs(lo), abs(hi))
    assert abs(got.mean - mean) <= KERNEL_BOUND * scale and abs(got.std - std) <= KERNEL_BOUND * scale, (got, mean, std)
    assert abs(got.mean - immediate.mean) <= IMMEDIATE_BOUND * scale
    assert abs(got.std - immediate.std) <= IMMEDIATE_BOUND * scale


@pytest.mark.slow
def test_one_batch_of_the_whole_corpus_takes_two_launches(monkeypatch):
    """Mixed dtypes and sizes in one batch: one _partials and one _combine launch; the rows equal
    those of batches of one tensor each (a tensor's partials do not depend on its neighbours)."""
    launches = []

    class Counted:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            launches.append(grid)
            return self.kernel[grid]

    tensors = [t for name, t in CORPUS if name != "float32-large"]  # interpreter time
    alone = _deferred_stats(tensors, _fused(), monkeypatch, batch_count=1)
    monkeypatch.setattr(stats_triton, "_partials", Counted(stats_triton._partials))
    monkeypatch.setattr(stats_triton, "_combine", Counted(stats_triton._combine))
    together = _deferred_stats(tensors, _fused(), monkeypatch, batch_count=len(tensors))
    assert len(launches) == 2
    # samples compared bit for bit: a NaN element equals itself there
    def fields(s):
        return {**vars(s), "sample": None if s.sample is None else np.asarray(s.sample, dtype=np.float64).tobytes()}

    assert [fields(s) for s in together] == [fields(s) for s in alone]


def test_an_empty_tensor_gets_a_row_of_no_finite_element():
    rows = torch.full((2, 7), -1.0, dtype=torch.float64)
    stats_triton.fused_rows([(torch.empty(0), rows[0]), (torch.empty(0, 3, dtype=torch.bfloat16), rows[1])],
                            stats_mod._rows_one_by_one)
    assert rows[:, 2:].eq(0).all() and rows[:, 0].eq(float("inf")).all() and rows[:, 1].eq(float("-inf")).all()


def test_what_the_kernel_takes():
    x = torch.randn(6, 8)
    row = torch.empty(7, dtype=torch.float64)
    assert stats_triton.takes(x, row) and stats_triton.takes(x.t(), row) and stats_triton.takes(x.bfloat16(), row)
    assert not stats_triton.takes(x[:, ::2], row)  # gaps
    assert not stats_triton.takes(x.double(), row) and not stats_triton.takes(x.int(), row)
    assert not stats_triton.takes(torch._neg_view(x), row)  # the memory holds -x


@pytest.mark.slow  # a real model, twice, under the interpreter
def test_a_recorded_llama_gets_the_same_statistics_from_the_fused_kernel_and_the_fallback(tmp_path, monkeypatch):
    """The batched path forced on CPU (tests/test_stats_batched.py), once per batch kernel."""
    import xray
    from xray.demo.models import bench_llama, token_batch

    model, ids = bench_llama(), token_batch(batch=1, seq=16, vocab=1000)  # small: the interpreter is slow
    monkeypatch.setenv("XRAY_DEFERRED_STATS", "1")
    monkeypatch.setenv("XRAY_STATS_BATCH", "1024,16777216")  # few launches: the interpreter is slow
    found = {}
    for label, kernel in (("fused", _fused()), ("fallback", stats_mod._rows_one_by_one)):
        monkeypatch.setitem(stats_mod.BATCH_KERNELS, "cpu", kernel)
        with torch.no_grad(), xray.dump(dump_dir=tmp_path / label, X_DEBUG=0x102, X_DEDUP=False, X_DUMP_NUM=0) as d:
            model(ids)
        found[label] = [(r.op, m.stats) for r in xray.load_dump(d.folder).records
                        for _, m in (*r.input_tensors(), *r.output_tensors()) if m.stats is not None]
    fused, fallback = found["fused"], found["fallback"]
    assert len(fused) >= 300 and [op for op, _ in fused] == [op for op, _ in fallback]
    for (op, f), (_, s) in zip(fused, fallback):
        assert (f.min, f.max, f.nan, f.posinf, f.neginf, f.numel) == (
            s.min, s.max, s.nan, s.posinf, s.neginf, s.numel), op
        if s.mean is None:
            assert f.mean is None, op
            continue
        scale = max(abs(s.min), abs(s.max), 1e-30)
        bound = 2 * KERNEL_BOUND * scale  # both within KERNEL_BOUND of the exact value
        assert abs(f.mean - s.mean) <= bound and abs(f.std - s.std) <= bound, (op, f, s)


# Compiles both kernels to an sm_90 cubin with the wheel's own ptxas: the compiled frontend checks
# what the interpreter does not (loop-carried and branch types, pointer casts), no GPU needed.
_COMPILE = textwrap.dedent("""
    import importlib, sys
    import triton
    from triton.compiler import ASTSource
    from triton.backends.compiler import GPUTarget
    try:
        importlib.import_module("triton.backends.nvidia.compiler")
    except ImportError:
        sys.exit(77)
    T = importlib.import_module("xray.dump.stats_triton")
    assert not T.INTERPRETED
    fixed = {"meta": "*i64", "partials": "*fp64", "total_programs": "i32", "NT": "constexpr"}
    for fn, consts in ((T._partials, {"NT": 512, "BLOCK": T.BLOCK, "ITERS": T.ITERS}),
                       (T._combine, {"NT": 512, "PB": T.PARTIAL_BLOCK})):
        signature = {**fixed, **{k: "constexpr" for k in consts}}
        kernel = triton.compile(ASTSource(fn, signature, consts), target=GPUTarget("cuda", 90, 32))
        assert kernel.asm["cubin"], fn
    print("compiled")
""")


@pytest.mark.slow  # two ahead-of-time compiles for sm_90 (7 s)
def test_the_kernels_compile_for_an_h100_without_one(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path), TRITON_DEFAULT_FP_FUSION="1")
    proc = subprocess.run([sys.executable, "-c", _COMPILE], capture_output=True, text=True, env=env, timeout=300)
    if proc.returncode == 77:
        pytest.skip("this triton has no CUDA backend")
    assert proc.returncode == 0 and "compiled" in proc.stdout, proc.stderr[-3000:]
