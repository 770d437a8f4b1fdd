"""Random ops (and uninitialized memory) still run on every backend, but their values are not
compared: such a row is NONDETERMINISTIC (supported, not within tolerance), never a false MISMATCH,
unless its output count, shape or dtype is wrong.

Which calls are random comes from torch's ``nondeterministic_seeded`` tag, minus the calls whose
recorded arguments draw nothing (eval mode, zero dropout probability).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

import xray
from xray.backends.base import ReplayStatus
from xray.replay.job import JobResult
from xray.replay.matrix import summary_table
from xray.ops.nondeterminism import nondeterministic
from xray.replay.runner import ReplayConfig, _row, replay_dump

RANDOM = ["aten.randn.default", "aten.bernoulli_.float", "aten.empty_like.default"]


@pytest.fixture(scope="module")
def dropout_dump(tmp_path_factory):
    """Noise plus a training-mode dropout (empty_like, bernoulli_, div_, mul on CPU), then a sin."""
    x = torch.linspace(-1, 1, 12).reshape(3, 4)
    with torch.no_grad(), xray.dump(X_DEDUP=True, X_DUMP_NUM=5, dump_dir=tmp_path_factory.mktemp("dump")) as d:
        noise = torch.randn(3, 4)
        y = F.dropout(x + noise, p=0.5, training=True)
        torch.sin(y)
    return d.folder


@pytest.mark.slow
def test_random_ops_run_on_each_backend_but_are_not_compared(dropout_dump, tmp_path):
    """Eager and ONNX Runtime draw different numbers: before, randn, bernoulli_ and empty_like read
    MISMATCH on ONNX Runtime and topped its worst-ops list. Now they ran (supported), their layout
    matches, their values are not compared; the deterministic sin is still compared and OK."""
    cfg = ReplayConfig(backends=["onnxrt-cpu"], out=tmp_path / "out", ops=["randn", "bernoulli_", "empty_like", "sin"],
                       repeats=1, progress=False, timeout=180)
    result = replay_dump(dropout_dump, cfg)
    by_op = {(r.op, r.backend): r for r in result.rows}
    assert {op for op, _ in by_op} == {*RANDOM, "aten.sin.default"}
    for backend in ("torch-cpu", "onnxrt-cpu"):
        for op in RANDOM:
            row = by_op[op, backend]
            assert ReplayStatus(row.status) == ReplayStatus.NONDETERMINISTIC, (op, backend, row.error)
            assert ReplayStatus(row.status).supported and row.max_abs_err is None
            assert row.error.startswith("values not compared")
        sin = by_op["aten.sin.default", backend]
        assert ReplayStatus(sin.status) == ReplayStatus.OK, (backend, sin.error)
    assert "nondeterministic_seeded" in by_op["aten.randn.default", "onnxrt-cpu"].error
    assert "uninitialized" in by_op["aten.empty_like.default", "onnxrt-cpu"].error

    table = summary_table(result)
    assert table.count("NONDETERMINISTIC=3, OK=1") == 2  # baseline and ONNX Runtime
    worst = table.split("worst on onnxrt-cpu:")[1]
    assert "sin" in worst and not any(op.split(".")[1] in worst for op in RANDOM)
    csv = pd.read_csv(tmp_path / "out" / "matrix.csv")
    assert (csv["status"] == "NONDETERMINISTIC").sum() == 6
    assert "NONDETERMINISTIC" in (tmp_path / "out" / "heatmap.html").read_text()


def test_a_random_op_with_a_wrong_layout_is_still_mismatch(dropout_dump):
    """Values are not compared, the layout is: count, shape and integer dtype must match."""
    rec = next(r for r in xray.load_dump(dropout_dump).records if r.op == "aten.randn.default")
    why = nondeterministic(rec)
    baseline = {rec.seq: [torch.randn(3, 4)]}

    def row(*outputs: np.ndarray):
        res = JobResult(int(ReplayStatus.OK), outputs=[(str(a.dtype), a) for a in outputs], latency_ms=0.1)
        return _row(rec, "onnxrt-cpu", res, baseline, False, lambda d: d, why)

    same = row(np.ones((3, 4), np.float32))
    assert ReplayStatus(same.status) == ReplayStatus.NONDETERMINISTIC and same.max_abs_err is None
    assert ReplayStatus(row(np.ones((3, 4), np.float16)).status) == ReplayStatus.NONDETERMINISTIC  # fp16 presets
    for outputs, what in [((np.ones((4, 3), np.float32),), "shape (4, 3), baseline (3, 4)"),
                          ((np.ones((3, 4), np.int64),), "dtype torch.int64"),
                          ((np.ones((3, 4), np.float32),) * 2, "2 outputs, baseline has 1")]:
        bad = row(*outputs)
        assert ReplayStatus(bad.status) == ReplayStatus.MISMATCH and what in bad.error and "values not compared" in bad.error


@pytest.mark.usefixtures("one_record_per_key")
def test_which_recorded_calls_are_random(tmp_path):
    """Tagged ops are random unless their recorded arguments draw nothing; empty* is uninitialized
    (no tag marks it); a zero-size output has no values to differ."""
    x = torch.linspace(-1, 1, 12).reshape(3, 4)
    q = torch.linspace(-1, 1, 24).reshape(1, 2, 3, 4)
    with torch.no_grad(), xray.dump(X_DEDUP=True, X_DUMP_NUM=0, dump_dir=tmp_path / "dump") as d:
        torch.rand(2), torch.randint(0, 5, (3,)), torch.randperm(5)
        torch.multinomial(torch.ones(4), 2), torch.bernoulli(torch.full((3,), 0.5))
        torch.empty(3).normal_(), torch.empty(3).uniform_(), torch.empty(3).exponential_()
        torch.native_dropout(x, 0.5, True), torch.native_dropout(x, 0.5, False)
        F.rrelu(x, training=True), F.rrelu(x, training=False)
        F.scaled_dot_product_attention(q, q, q)  # tagged (it has dropout_p), draws nothing at 0
        torch.empty(1, 0, 4)  # an empty KV cache
        torch.sin(x)
    records = xray.load_dump(d.folder).records

    def why(op: str, **args) -> str | None:
        [rec] = [r for r in records if r.op == op and all(r.inputs.get(k) == v for k, v in args.items())]
        return nondeterministic(rec)

    random = {r.op for r in records if (nondeterministic(r) or "").endswith("(tagged nondeterministic_seeded)")}
    assert random == {"aten.rand.default", "aten.randint.low", "aten.randperm.default", "aten.multinomial.default",
                      "aten.bernoulli.default", "aten.normal_.default", "aten.uniform_.default",
                      "aten.exponential_.default", "aten.native_dropout.default", "aten.rrelu_with_noise.default"}
    assert why("aten.native_dropout.default", train=True) and why("aten.rrelu_with_noise.default", training=True)
    assert why("aten.native_dropout.default", train=False) is None
    assert why("aten.rrelu_with_noise.default", training=False) is None
    assert why("aten._scaled_dot_product_flash_attention_for_cpu.default", dropout_p=0.0) is None
    assert "uninitialized" in why("aten.empty.memory_format", size=[3])
    assert why("aten.empty.memory_format", size=[1, 0, 4]) is None
    assert why("aten.sin.default") is None
