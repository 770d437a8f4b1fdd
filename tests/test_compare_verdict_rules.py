"""Verdict rules on hand-built dumps (issue 17): one regression test per class, each failing on
the old execution-order / 99 %-close rules. Dumps are written with xray's own DumpWriter, with
format-v2 sources where the class is about data edges."""
from __future__ import annotations

import math

import torch

from xray.compare import compare_dumps, PairStatus
from xray.demo.synthetic import Op, write_dump
from xray.numerics.metrics import chunk_partial, finish
from xray.numerics.rules import Tolerance, round_mantissa, ulp_distance


def _x(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _pair(tmp_path, bench, target, save=True):
    return compare_dumps(write_dump(tmp_path / "a", bench, save), write_dump(tmp_path / "b", target, save))


# -- class 1: partial corruption fails, and is never an agreeing input ----------------------------
def test_partial_corruption_fails_and_blames_its_producer(tmp_path):
    x = _x(100, 100)
    y = x.relu()
    bad = y.clone()
    bad.view(-1)[[10, 500, 7000]] *= 2.0  # three wrong elements of 10,000: 99.97 % close
    r = _pair(tmp_path, [Op("aten.relu.default", y, inputs={"self": x}, sources={"self": "input"}),
                         Op("aten.neg.default", -y, inputs={"self": y}, sources={"self": "op:0:0"})],
              [Op("aten.relu.default", bad, inputs={"self": x}, sources={"self": "input"}),
               Op("aten.neg.default", -bad, inputs={"self": bad}, sources={"self": "op:0:0"})])
    assert [row.status for row in r.rows] == ["fail", "fail"]
    assert [row.origin for row in r.rows] == ["born", "inherited"]
    fd = r.summary.first_divergence
    assert fd["target_seq"] == 0 and fd["cause"] == "local error"


def test_zeroed_column_and_spike_fail(tmp_path):
    x = _x(64, 64)
    col, spike = x.clone(), x.clone()
    col[:, 5] = 0
    spike[3, 3] += 50
    r = _pair(tmp_path, [Op("aten.relu.default", x), Op("aten.neg.default", x)],
              [Op("aten.relu.default", col), Op("aten.neg.default", spike)])
    assert [row.status for row in r.rows] == ["fail", "fail"]


def test_integer_rows_pass_or_fail_never_warn(tmp_path):
    i = torch.arange(10_000, dtype=torch.int64)
    j = i.clone()
    j[17] += 1
    r = _pair(tmp_path, [Op("aten.argmax.default", i)], [Op("aten.argmax.default", j)])
    assert r.rows[0].status == "fail"


# -- class 2: small tensors keep relative sensitivity ------------------------------------------
def test_small_variance_error_is_born_at_the_mean_not_the_rsqrt(tmp_path):
    x = 0.02 * _x(4, 64)
    sq = x * x
    var = sq.mean(-1, keepdim=True)  # ~4e-4
    ops = lambda v: [Op("aten.pow.Tensor_Scalar", sq, inputs={"self": x}, sources={"self": "input"}),  # noqa: E731
                     Op("aten.mean.dim", v, inputs={"self": sq}, sources={"self": "op:0:0"}),
                     Op("aten.add.Tensor", v + 1e-6, inputs={"self": v}, sources={"self": "op:1:0"}),
                     Op("aten.rsqrt.default", (v + 1e-6).rsqrt(), inputs={"self": v + 1e-6}, sources={"self": "op:2:0"})]
    r = _pair(tmp_path, ops(var), ops(var * (1 + 1e-3)))
    assert r.rows[1].status == "fail"
    assert r.summary.first_divergence["op"] == "aten.mean.dim"


# -- class 3: parameters are not inputs -----------------------------------------------------------
def test_changed_weight_names_the_innermost_module_and_the_parameter(tmp_path):
    x, w = _x(4, 8), _x(16, 8, seed=1)
    w2 = w.clone()
    w2[0, 0] += 0.5
    def ops(weight):
        h = x @ weight.t()
        return [Op("LlamaMLP", h.relu(), module="mlp", kind="module", inputs={"x": x}, sources={"x": "input"}),
                Op("Linear", h, module="mlp.up", kind="module", inputs={"x": x}, sources={"x": "input"},
                   params={"weight": weight}),
                Op("ReLU", h.relu(), module="mlp.act", kind="module", inputs={"x": h}, sources={"x": "op:1:0"})]
    r = _pair(tmp_path, ops(w), ops(w2))
    fd = r.summary.first_divergence
    assert fd["module"] == "mlp.up" and fd["cause"] == "parameter"
    assert "mlp.up.weight" in fd["culprit"]


def test_parameter_input_of_an_op_makes_it_born(tmp_path):
    x, w = _x(4, 8), _x(8, 8, seed=1)
    w2 = w * 1.01
    ops = lambda ww: [Op("aten.mm.default", x @ ww, inputs={"self": x, "mat2": ww},  # noqa: E731
                         sources={"self": "input", "mat2": "param:lin.weight"})]
    r = _pair(tmp_path, ops(w), ops(w2))
    assert r.rows[0].origin == "born" and r.rows[0].cause == "parameter"
    assert "lin.weight" in r.summary.first_divergence["culprit"]


# -- class 4: target-only ops are candidates ---------------------------------------------------------
def test_target_only_op_is_named_the_origin(tmp_path):
    x = _x(8, 8)
    h = x.exp()
    bench = [Op("aten.exp.default", h, inputs={"self": x}, sources={"self": "input"}),
             Op("aten.relu.default", h.relu(), inputs={"self": h}, sources={"self": "op:0:0"}),
             Op("aten.neg.default", -h.relu(), inputs={"self": h.relu()}, sources={"self": "op:1:0"})]
    bad = h * 1.01
    target = [Op("aten.exp.default", h, inputs={"self": x}, sources={"self": "input"}),
              Op("aten.mul.Tensor", bad, inputs={"self": h}, sources={"self": "op:0:0"}),  # only the target
              Op("aten.relu.default", bad.relu(), inputs={"self": bad}, sources={"self": "op:1:0"}),
              Op("aten.neg.default", -bad.relu(), inputs={"self": bad.relu()}, sources={"self": "op:2:0"})]
    r = _pair(tmp_path, bench, target)
    fd = r.summary.first_divergence
    assert fd["cause"] == "target-only op" and fd["culprit_target_seq"] == 1
    assert fd["target_op"] == "aten.relu.default" and "aten.mul.Tensor" in fd["culprit"]


# -- local error by recomputation; precision loss (class 5) ----------------------------------------
def _mm_chain(n, scale_call=None, scale=1.0, tf32=False, seed=0):
    """n chained mm calls with saved inputs; ``tf32`` rounds every call's inputs to 10 bits."""
    x = _x(16, 32, seed=seed)
    ops = []
    for i in range(n):
        w = _x(32, 32, seed=100 + i) / 32 ** 0.5
        a, b = (round_mantissa(x, 10).float(), round_mantissa(w, 10).float()) if tf32 else (x, w)
        out = (a.double() @ b.double()).float() if tf32 else x @ w
        if i == scale_call:
            out = out * scale
        ops.append(Op("aten.mm.default", out, inputs={"self": x, "mat2": w}, save_inputs=True,
                      sources={"self": "input" if i == 0 else f"op:{i - 1}:0", "mat2": f"param:w{i}"}))
        x = out
    return ops


def test_local_error_is_measured_and_names_the_op(tmp_path):
    r = _pair(tmp_path, _mm_chain(4), _mm_chain(4, scale_call=1, scale=1 + 1e-3))
    born = r.rows[1]
    assert born.origin == "born" and born.cause == "local error"
    assert born.local_err > 5e-4 and born.local_floor < 1e-5
    assert r.rows[2].origin == "inherited" and r.rows[2].local_err < 1e-5  # computed right on bad inputs
    fd = r.summary.first_divergence
    assert fd["target_seq"] == 1 and fd["local_err"] > 5e-4 and fd["accumulated_err"] > 5e-4


def test_consistent_tf32_is_precision_loss_but_a_bug_under_it_is_found(tmp_path):
    clean = _pair(tmp_path / "noise", _mm_chain(6), _mm_chain(6, tf32=True))
    assert not [row for row in clean.rows if row.status == "fail"]
    assert {row.cause for row in clean.rows if row.status == "warning"} == {"precision loss"}
    assert clean.summary.first_divergence is None
    buggy = _pair(tmp_path / "bug", _mm_chain(6), _mm_chain(6, tf32=True, scale_call=3, scale=1 + 3e-3))
    assert buggy.summary.first_divergence["target_seq"] == 3


def test_a_bug_within_bf16_noise_is_found_by_its_local_error(tmp_path):
    """A 5 % kernel error in a bf16 run passes as bf16 precision on accumulated error (a warning,
    like every other bf16 row); recomputed on its own inputs it is far above the bf16 floor."""
    def chain(bug: float):
        x = _x(16, 64)
        ops = []
        for i in range(4):
            w = (_x(64, 64, seed=10 + i) / 8).bfloat16()
            xb = x.bfloat16()
            out = xb @ w
            if i == 2:
                out = out * (1 + bug)
            ops.append(Op("aten.mm.default", out, inputs={"self": xb, "mat2": w}, save_inputs=True,
                          sources={"self": "input" if i == 0 else f"op:{i - 1}:0", "mat2": f"param:w{i}"}))
            x = out.float()
        return ops
    bench = [Op(o.op, o.out.float(), inputs={k: v.float() for k, v in o.inputs.items()}, sources=o.sources,
                save_inputs=True) for o in chain(0.0)]
    clean = _pair(tmp_path / "noise", bench, chain(0.0))
    assert clean.summary.first_divergence is None and not [r for r in clean.rows if r.status == "fail"]
    buggy = _pair(tmp_path / "bug", bench, chain(5e-2))
    fd = buggy.summary.first_divergence
    assert fd is not None and fd["target_seq"] == 2 and fd["cause"] == "local error"


def test_a_kind_called_once_joins_the_precision_other_kinds_show(tmp_path):
    """A kind called once (a ViT's one patch convolution; here one bmm) under TF32 cannot be
    consistent with itself; at the level the run's mm calls show it is precision loss too."""
    a, b = _x(2, 16, 32, seed=7), _x(2, 32, 16, seed=8) / 32 ** 0.5

    def run(tf32: bool):
        r10 = (lambda t: round_mantissa(t, 10).float()) if tf32 else (lambda t: t)
        once = (r10(a).double() @ r10(b).double()).float() if tf32 else a @ b
        return [Op("aten.bmm.default", once, inputs={"self": a, "mat2": b}, save_inputs=True,
                   sources={"self": "input", "mat2": "input"}, module="patch")] + \
            [Op(o.op, o.out, inputs=o.inputs, save_inputs=True, sources={
                k: f"op:{int(v.split(':')[1]) + 1}:0" if v.startswith("op:") else v for k, v in o.sources.items()})
             for o in _mm_chain(5, tf32=tf32)]
    r = _pair(tmp_path, run(False), run(True))
    once = r.rows[0]
    assert once.status == "warning" and once.cause == "precision loss", (once.status, once.culprit)
    assert r.summary.first_divergence is None


def test_statistics_only_consistent_precision_is_a_warning_and_a_lone_bug_is_not(tmp_path):
    """No tensors saved, nothing recomputed: a kind born on several calls at one small relative
    level is precision loss; a single call of another kind far above it stays the bug."""
    def linears(scales):
        x, ops = _x(8, 32), []
        for i, s in enumerate(scales):
            w = _x(32, 32, seed=200 + i) / 32 ** 0.5
            out = (x @ w) * s
            ops.append(Op("Linear", out, module=f"l{i}", kind="module", inputs={"x": x}, sources={"x": "input"}))
            x = _x(8, 32, seed=300 + i)  # each layer fed afresh: every call's inputs agree
        return ops
    bench = linears([1.0] * 4)
    noisy = _pair(tmp_path / "noise", bench, linears([1 + 2e-4, 1 - 3e-4, 1 + 1.5e-4, 1 + 2.5e-4]), save=False)
    assert not [r for r in noisy.rows if r.status == "fail"] and noisy.summary.first_divergence is None
    bug = _pair(tmp_path / "bug", bench, linears([1.0, 1.0, 1 + 2e-2, 1.0]), save=False)
    assert bug.summary.first_divergence["module"] == "l2"
    systematic = _pair(tmp_path / "sys", bench, linears([0.99] * 4), save=False)  # beyond any precision step
    assert systematic.summary.first_divergence["module"] == "l0"


def test_an_inserted_target_only_op_that_changes_values_is_the_origin_even_within_precision(tmp_path):
    """The target routes a shared edge through an extra op that scales it by 1e-3; the residual
    add after it dilutes that to a precision-sized warning. An inserted cast does not count."""
    x, res = _x(8, 64), 100 * _x(8, 64, seed=3)
    h = x.relu()

    def target(extra_op: str, extra: torch.Tensor):
        return [Op("aten.relu.default", h, inputs={"self": x}, sources={"self": "input"}, save_inputs=True),
                Op(extra_op, extra, inputs={"self": h}, sources={"self": "op:0:0"}, save_inputs=True),
                Op("aten.add.Tensor", extra.float() + res, inputs={"self": extra, "other": res}, save_inputs=True,
                   sources={"self": "op:1:0", "other": "input"})]
    bench = [Op("aten.relu.default", h, inputs={"self": x}, sources={"self": "input"}, save_inputs=True),
             Op("aten.add.Tensor", h + res, inputs={"self": h, "other": res}, save_inputs=True,
                sources={"self": "op:0:0", "other": "input"})]
    scaled = _pair(tmp_path / "mul", bench, target("aten.mul.Tensor", h * (1 + 1e-3)))
    fd = scaled.summary.first_divergence
    assert fd is not None and fd["cause"] == "target-only op" and fd["culprit_target_seq"] == 1
    cast = _pair(tmp_path / "cast", bench, target("aten._to_copy.default", h.half()))  # autocast's kind
    assert cast.summary.first_divergence is None


def test_an_inserted_round_trip_through_bf16_is_held_to_bf16_rounding(tmp_path):
    """A bf16 autocast backward casts a float32 gradient to bfloat16 and back (AIMv2's RMSNorm):
    the producer looks through the widening cast to the narrowing one, so the change across both
    is bfloat16's rounding, not float32's. A 10 % scale on that edge is still the origin."""
    x, res = _x(8, 64), 100 * _x(8, 64, seed=3)
    h = x.relu()

    def target(narrowed: torch.Tensor):
        widened = narrowed.float()
        return [Op("aten.relu.default", h, inputs={"self": x}, sources={"self": "input"}, save_inputs=True),
                Op("aten._to_copy.default", narrowed, inputs={"self": h}, sources={"self": "op:0:0"}, save_inputs=True),
                Op("aten._to_copy.default", widened, inputs={"self": narrowed}, sources={"self": "op:1:0"},
                   save_inputs=True),
                Op("aten.add.Tensor", widened + res, inputs={"self": widened, "other": res}, save_inputs=True,
                   sources={"self": "op:2:0", "other": "input"})]
    bench = [Op("aten.relu.default", h, inputs={"self": x}, sources={"self": "input"}, save_inputs=True),
             Op("aten.add.Tensor", h + res, inputs={"self": h, "other": res}, save_inputs=True,
                sources={"self": "op:0:0", "other": "input"})]
    assert _pair(tmp_path / "cast", bench, target(h.bfloat16())).summary.first_divergence is None
    fd = _pair(tmp_path / "bug", bench, target((h * 1.1).bfloat16())).summary.first_divergence
    assert fd is not None and fd["cause"] == "target-only op" and fd["culprit_target_seq"] == 1, fd


def test_an_integer_result_right_on_its_inputs_is_not_born(tmp_path):
    """Pooling indices or an argmax flip when near-equal inputs move by rounding (bf16 upstream):
    recomputed on the target's own inputs they are right, so not a bug; a wrong one still is."""
    x = _x(4, 64)
    x[:, 7] = x.max() + 1.0
    x[:, 9] = x[:, 7] + 1e-6  # the argmax, by a hair
    moved = x.clone()
    moved[:, 9] -= 2e-6  # within float32 agreement, and now column 7 wins
    op = lambda inp, out: Op("aten.argmax.default", out, inputs={"self": inp}, sources={"self": "input"},  # noqa: E731
                             save_inputs=True)
    flipped = _pair(tmp_path / "tie", [op(x, x.argmax())], [op(moved, moved.argmax())])
    assert flipped.rows[0].status == "warning" and flipped.summary.first_divergence is None
    wrong = _pair(tmp_path / "bug", [op(x, x.argmax())], [op(x, x.argmax() + 1)])
    assert wrong.rows[0].status == "fail" and wrong.summary.first_divergence["cause"] == "local error"


def test_statistics_only_rule_counts_calls_not_outputs(tmp_path):
    """A module call returning two outputs is one call: alone it shows no consistent level, so
    its error stays a failure (it read as "2 calls" of precision loss and hid a conv bug)."""
    x = _x(8, 32)
    run = lambda s: [Op("Encoder", x * s, module="enc", kind="module", inputs={"x": x},  # noqa: E731
                        sources={"x": "input"}, more_outputs=[(x * s).sum(0)])]
    r = _pair(tmp_path, run(1.0), run(1 + 3e-4), save=False)
    assert r.summary.first_divergence is not None and r.summary.first_divergence["module"] == "enc"


# -- class 6: no overflow, no recursion --------------------------------------------------------------
def test_metrics_are_finite_safe_near_float_max():
    big = torch.finfo(torch.float32).max
    b = torch.tensor([big, -big, 1.0, float("nan"), 0.5])
    t = torch.tensor([-big, -big * 0.99, 1.0, float("nan"), 0.5])
    m = finish(chunk_partial(b, t, Tolerance(1.3e-6, 1e-5)))  # recursed until RecursionError before
    assert m.gt_num == 2 and math.isfinite(m.cosine) and m.max_abs_err == float("inf") or m.max_abs_err > 1e38
    e20 = _x(1000) * 1e20
    m = finish(chunk_partial(e20, e20 * 1.5, Tolerance(1.3e-6, 1e-5)))
    assert math.isfinite(m.rmse) and m.rel_rmse == __import__("pytest").approx(0.5, rel=1e-6)
    d64 = torch.tensor([1e308, -1e308], dtype=torch.float64)
    m = finish(chunk_partial(d64, -d64, Tolerance(1e-7, 1e-7)))
    assert m.cosine == __import__("pytest").approx(-1.0) and m.gt_num == 2


def test_ulp_distance():
    a = torch.tensor([1.0, -0.0, 0.0, -1.0])
    b = torch.nextafter(a, torch.tensor(2.0))
    assert ulp_distance(a, b).tolist() == [1, 1, 1, 1]
    assert int(ulp_distance(torch.tensor([-1e-45]), torch.tensor([1e-45]))[0]) == 2


# -- class 8: reshape-compatible pairs are not compared in memory order ------------------------------
def test_reshaped_pair_is_not_agreement(tmp_path):
    x = _x(8, 32, 16)
    anchor = Op("aten.relu.default", x.relu())  # one record both runs share, so the pair is judged
    r = _pair(tmp_path, [anchor, Op("aten.view.default", x)], [anchor, Op("aten.view.default", x.reshape(2, 4, 16, 32))])
    assert r.rows[0].status == PairStatus.PASS.value
    views = [row for row in r.rows if "view" in (row.bench_op or row.target_op)]
    assert views and not [row for row in views if row.status == PairStatus.PASS.value]


def test_only_reshaped_records_is_no_match(tmp_path):
    """Nothing comparable is a refusal, never a silent 'no divergence'."""
    from xray.compare.pairing import CompareInputError
    x = _x(8, 32, 16)
    with __import__("pytest").raises(CompareInputError, match="could be matched"):
        _pair(tmp_path, [Op("aten.view.default", x)], [Op("aten.view.default", x.reshape(2, 4, 16, 32))])


def _layer_norm_step(folder, dump_num: int):
    """A layer norm's forward and backward, recorded with ``dump_num`` tensors a record: its
    backward has six tensor inputs (grad, input, mean, rstd, weight, bias), the last one unsaved
    under the default 5."""
    import xray

    torch.manual_seed(0)
    norm = torch.nn.LayerNorm(64)
    x = torch.randn(8, 64, requires_grad=True)
    with xray.dump(dump_dir=folder, X_DEBUG=0x11A, X_DEDUP=False, X_DUMP_NUM=dump_num):
        (norm(x) * torch.linspace(-1, 1, 64)).sum().backward()
    return xray.load_dump(next(folder.iterdir()))


def test_an_input_left_unsaved_counts_only_where_the_op_reads_its_values(tmp_path):
    """X_DUMP_NUM spent before the last input: the call is re-run with that input drawn twice,
    differently; a layer norm backward, which reads its bias for its shape only, gives the same
    bits and gets a local error, measured as if the bias were saved. An add whose second operand
    is unsaved reads it: no local error (never a verdict on values nobody saved), even where that
    operand's statistics say "constant" (a mask of 0 and -inf: min = max = 0 over finite values)."""
    from xray.compare.local import local_error

    dump = _layer_norm_step(tmp_path / "ln", 5)
    backward = next(r for r in dump.records if r.op == "aten.native_layer_norm_backward.default")
    metas = [m for _, m in backward.input_tensors()]
    assert len(metas) == 6 and metas[-1].data is None and all(m.data is not None for m in metas[:-1])
    outputs = [m for _, m in backward.output_tensors()]
    got = local_error(backward, dump, outputs[0], 0)
    assert got is not None and got.local <= max(got.floor, 1e-6), got
    full = _layer_norm_step(tmp_path / "all", 8)
    again = next(r for r in full.records if r.op == "aten.native_layer_norm_backward.default")
    assert local_error(again, full, list(m for _, m in again.output_tensors())[0], 0).local == got.local

    import xray

    # (past SMALL_OUTPUT elements: a smaller float32 add keeps a self-check, its local error)
    mask = torch.zeros(8, 1024).masked_fill(torch.rand(8, 1024) < 0.3, -math.inf)
    with xray.dump(dump_dir=tmp_path / "add", X_DEBUG=0x112, X_DEDUP=False, X_DUMP_NUM=1):
        torch.randn(8, 1024) + mask
    dump = xray.load_dump(next((tmp_path / "add").iterdir()))
    add = next(r for r in dump.records if r.op == "aten.add.Tensor")
    assert [m.data is not None for _, m in add.input_tensors()] == [True, False]
    assert local_error(add, dump, next(m for _, m in add.output_tensors()), 0) is None


def test_an_unsaved_input_is_known_when_constant_and_read_when_zeros_change_the_output(tmp_path):
    """float16 ``1 + t1 / t2`` with a tiny t1 (an AdamW update whose denominator underflowed):
    random values of t2 round away, so two random draws agree; zeros give Inf, so the unsaved t2
    is read and there is no local error. A t2 whose statistics say "all zeros" is known whole: the
    call is re-run on it and the Inf it makes is computed right on its inputs."""
    import xray
    from xray.compare.local import local_error

    ones = torch.ones(64, dtype=torch.float16)
    tiny = torch.full((64,), 1e-7).half()  # a subnormal: any random denominator rounds it away
    some_zeros = torch.rand(64).masked_fill(torch.rand(64) < 0.5, 0).half()
    for name, denominator in (("read", some_zeros), ("known", torch.zeros(64, dtype=torch.float16))):
        with xray.dump(dump_dir=tmp_path / name, X_DEBUG=0x112, X_DEDUP=False, X_DUMP_NUM=2):
            torch.addcdiv(ones, tiny, denominator)
    for name in ("read", "known"):
        dump = xray.load_dump(next((tmp_path / name).iterdir()))
        call = next(r for r in dump.records if r.op == "aten.addcdiv.default")
        assert [m.data is not None for _, m in call.input_tensors()] == [True, True, False]
        output = next(m for _, m in call.output_tensors())
        assert output.data is not None and output.stats.posinf + output.stats.neginf > 0
        got = local_error(call, dump, output, 0, checked=False)  # the re-run alone, not its self-check
        if name == "read":
            assert got is None
        else:
            assert got is not None and got.local == 0.0, got
