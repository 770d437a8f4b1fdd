"""xray-compare on small hand-built dumps: metrics, rules, alignment, layout, bad inputs."""
from __future__ import annotations

import json
import math

import pytest
import torch

from xray.compare import Rules, PairStatus, compare_dumps
from xray.compare.cli import main
from xray.compare.entry_table import Codes, EntryTable
from xray.compare.layout import find_layout
from xray.compare.matching import align_tables
from xray.numerics.metrics import Partial, as_real, chunk_partial, finish, merge
from xray.compare.stream import chunk_selections
from xray.demo.synthetic import Op, write_dump
from xray.numerics.rules import SMALLEST_NORMAL, Tolerance, default_tolerance, parse_tolerance_arg
from xray.dump.dump_columns import DumpColumns
from xray.dump.model import Record, TensorMeta


def _pair(tmp_path, bench_ops, target_ops, save=True):
    return write_dump(tmp_path / "a", bench_ops, save), write_dump(tmp_path / "b", target_ops, save)


def _x(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# -- metrics -------------------------------------------------------------------------------
def test_metrics_match_direct_formulas_across_chunks():
    a, b = _x(10_000, seed=1), _x(10_000, seed=2) * 0.01 + _x(10_000, seed=1)
    tol = Tolerance(1e-3, 1e-5)
    p = Partial()
    for lo in range(0, 10_000, 3000):  # uneven chunks must merge to the whole-tensor metrics
        p = merge(p, chunk_partial(as_real(a[lo:lo + 3000], torch.float32), as_real(b[lo:lo + 3000], torch.float32), tol))
    m = finish(p)
    a64, b64 = a.double(), b.double()
    # float32 chunk sums vs float64 reference: 1e-5 relative is well above float32 rounding of 1e4 terms
    assert m.cosine == pytest.approx(float(torch.nn.functional.cosine_similarity(a64, b64, dim=0)), rel=1e-5)
    assert m.rmse == pytest.approx(float((a64 - b64).pow(2).mean().sqrt()), rel=1e-5)
    assert m.max_abs_err == pytest.approx(float((a64 - b64).abs().max()), rel=1e-6)
    not_close = int((~torch.isclose(b, a, rtol=1e-3, atol=1e-5)).sum())
    assert m.gt_num == not_close
    assert m.isclose_pct == pytest.approx(100 * (1 - not_close / 10_000))


def test_equal_nonfinite_values_agree_and_mismatches_count():
    a = torch.tensor([1.0, float("-inf"), float("nan"), 2.0])
    b = torch.tensor([1.0, float("-inf"), float("nan"), float("nan")])
    m = finish(chunk_partial(a, b, Tolerance(0, 0)))
    assert m.nonfinite_mismatch == 1 and m.gt_num == 1 and m.nan_target == 2 and m.inf_bench == 1


def test_default_tolerances_are_assert_close_defaults():
    # (rtol, atol) are assert_close's; tiny is the dtype's smallest normal (torch.finfo)
    assert default_tolerance("float32") == Tolerance(1.3e-6, 1e-5, torch.finfo(torch.float32).tiny)
    assert default_tolerance("bfloat16") == Tolerance(1.6e-2, 1e-5, torch.finfo(torch.bfloat16).tiny)
    assert default_tolerance("int64") == Tolerance(0.0, 0.0)
    # the looser side, and the larger smallest normal
    assert Rules().tolerance("float32", "bfloat16") == Tolerance(1.6e-2, 1e-5, torch.finfo(torch.float32).tiny)
    assert Rules().tolerance("float32", "float16").tiny == torch.finfo(torch.float16).tiny
    for name, tiny in SMALLEST_NORMAL.items():
        dtype = getattr(torch, name, None)
        assert dtype is None or torch.finfo(dtype if not dtype.is_complex else dtype.to_real()).tiny == tiny, name
    # below the smallest normal rounding is absolute: no element floor under rtol x tiny
    fp16 = default_tolerance("float16")
    assert fp16.floor(1e-9) == pytest.approx(1e-3 * 2 ** -14) and fp16.floor(1.0) == pytest.approx(2e-3)
    assert parse_tolerance_arg("bfloat16:rtol=0.02,atol=1e-4") == ("bfloat16", 0.02, 1e-4)
    with pytest.raises(ValueError, match="DTYPE:rtol"):
        parse_tolerance_arg("rtol=0.1")


def test_chunk_selections_cover_every_element_once():
    for shape, limit in [((7, 5, 3), 10), ((3, 1000), 64), ((1, 2, 3), 1), ((0, 4), 8), ((), 4), ((9,), 4)]:
        t = torch.arange(max(1, math.prod(shape)) if shape else 1).reshape(shape) if math.prod(shape) else torch.zeros(shape)
        pieces = [t[sel].reshape(-1) for sel in chunk_selections(shape, limit)]
        assert all(p.numel() <= max(limit, shape[-1] if shape else 1) for p in pieces)
        assert torch.equal(torch.cat(pieces) if pieces else torch.zeros(0), t.reshape(-1))


# -- statuses --------------------------------------------------------------------------------
def test_pass_warning_fail_and_tolerance_override(tmp_path):
    x = _x(100, 100)
    noisy = x * (1 + 3e-6 * _x(100, 100, seed=5))  # rounding-like spread (rel RMSE ~2x rtol): warning
    ops_a = [Op("aten.relu.default", x), Op("aten.neg.default", x), Op("aten.abs.default", x)]
    ops_b = [Op("aten.relu.default", x), Op("aten.neg.default", noisy), Op("aten.abs.default", x * 1.5)]
    a, b = _pair(tmp_path, ops_a, ops_b)
    r = compare_dumps(a, b)
    assert [row.status for row in r.rows] == ["pass", "warning", "fail"]
    assert r.rows[1].gt_num > 0 and r.rows[0].cosine == pytest.approx(1.0)
    loose = compare_dumps(a, b, rules=Rules().with_override("float32", rtol=1.0, atol=1e-2))
    assert [row.status for row in loose.rows] == ["pass", "pass", "pass"]


def test_statistics_only_compare(tmp_path):
    x = _x(64, 64)
    a, b = _pair(tmp_path, [Op("aten.relu.default", x), Op("aten.neg.default", x), Op("aten.abs.default", x)],
                 [Op("aten.relu.default", x), Op("aten.neg.default", x * (1 + 1e-5)), Op("aten.abs.default", x + 1.0)],
                 save=False)
    r = compare_dumps(a, b)
    assert [row.mode for row in r.rows] == ["stats"] * 3
    # 1e-5 relative drift is ~8x float32's rtol: warning; a shift of 1.0 is far outside: fail
    assert [row.status for row in r.rows] == ["pass", "warning", "fail"]


def test_dtype_mismatch_is_compared_after_upcast(tmp_path):
    x = _x(32, 32)
    a, b = _pair(tmp_path, [Op("aten.mm.default", x)], [Op("aten.mm.default", x.bfloat16())])
    row = compare_dumps(a, b).rows[0]
    assert row.status == "pass" and row.rtol == 1.6e-2 and "bfloat16" in row.note


def test_zero_size_tensors_pass_with_a_note(tmp_path):
    e = torch.zeros(0, 4)
    a, b = _pair(tmp_path, [Op("aten.empty.memory_format", e)], [Op("aten.empty.memory_format", e)])
    row = compare_dumps(a, b).rows[0]
    assert row.status == "pass" and "empty" in row.note


def test_nan_everywhere_is_reported(tmp_path, capsys):
    x = _x(16, 16)
    nan = torch.full((16, 16), float("nan"))
    a, b = _pair(tmp_path, [Op("aten.relu.default", x), Op("aten.neg.default", x)],
                 [Op("aten.relu.default", nan), Op("aten.neg.default", nan)])
    r = compare_dumps(a, b)
    assert {row.status for row in r.rows} == {PairStatus.NAN_INF.value}
    assert any("entirely NaN/Inf" in w for w in r.summary.warnings)
    assert main([str(a), str(b), str(tmp_path / "o.csv")]) == 0  # usable input: the compare ran
    assert "entirely NaN/Inf" in capsys.readouterr().out


# -- layout ----------------------------------------------------------------------------------
def test_layout_detector_on_permuted_pairs(tmp_path):
    nchw = _x(2, 3, 4, 5)
    tol = Tolerance(1e-6, 1e-6)
    assert find_layout(nchw, nchw.permute(0, 2, 3, 1), tol) == "permute(0, 2, 3, 1)"
    # NHWC memory read back as if it were NCHW (same shape, scrambled data)
    assert find_layout(nchw, nchw.permute(0, 2, 3, 1).contiguous().reshape(nchw.shape), tol).startswith("permute(0, 2, 3, 1) reinterpreted")
    m = _x(6, 6)
    assert find_layout(m, m.t().contiguous(), tol) == "permute(1, 0)"
    assert find_layout(m, _x(6, 6, seed=5), tol) is None
    # values far below atol (a gradient of 1e-10): every permutation is "close", so none is a layout
    tiny = _x(4, 16, 64) * 1e-10
    assert find_layout(tiny, tiny * 1.01, Tolerance(1.3e-6, 1e-5)) is None
    a, b = _pair(tmp_path, [Op("aten.convolution.default", nchw)],
                 [Op("aten.convolution.default", nchw.permute(0, 2, 3, 1).contiguous())])
    row = compare_dumps(a, b).rows[0]
    assert row.status == "fail" and row.layout == "permute(0, 2, 3, 1)" and "layout mismatch" in row.note


# -- alignment -------------------------------------------------------------------------------
class _Records:
    """A dump held as Records (as a JSON or module dump is): compare builds its columns."""

    def __init__(self, records):
        self.records = records


def _align(bench_specs, target_specs):
    """Matched (bench, target) positions of two entry lists given as (kind, op, module, shape)."""
    codes = Codes()

    def table(specs):
        recs = [Record(seq=i, kind=kind, op=op, module=module, outputs=[TensorMeta(shape, "float32")])
                for i, (kind, op, module, shape) in enumerate(specs)]
        return EntryTable(DumpColumns(_Records(recs)), codes)

    pa, pb, _ = align_tables(table(bench_specs), table(target_specs), codes)
    return list(zip(pa.tolist(), pb.tolist()))


def test_alignment_survives_fusion_renames_and_wrapper_prefixes():
    bench = [("op", "aten.mm.default", "model.l0", (4, 8)), ("op", "aten.add.Tensor", "model.l0", (4, 8)),
             ("op", "aten.relu.default", "model.l0", (4, 8)), ("module", "ColumnParallelLinear", "model.l0", (4, 8)),
             ("op", "aten.mm.default", "model.l1", (4, 2)), ("op", "aten.sum.default", "model.l1", ())]
    # target: DDP prefix, add+relu fused into one op, class misspelled, an extra copy op
    target = [("op", "aten.mm.default", "module.model.l0", (4, 8)),
              ("op", "aten.fused_add_relu.default", "module.model.l0", (4, 8)),
              ("module", "ColumnParalleLinear", "module.model.l0", (4, 8)),
              ("op", "aten._to_copy.default", "module.model.l1", (4, 8)),
              ("op", "aten.mm.default", "module.model.l1", (4, 2)),
              ("op", "aten.sum.default", "module.model.l1", ())]
    assert _align(bench, target) == [(0, 0), (3, 2), (4, 4), (5, 5)]


def test_alignment_with_an_empty_side_pairs_nothing():
    one = [("op", "aten.mm.default", "l", (4, 8)), ("op", "aten.add.Tensor", "l", (4, 8))]
    assert _align([], one) == [] and _align(one, []) == [] and _align([], []) == []


@pytest.mark.slow
def test_alignment_handles_different_call_counts_at_scale():
    block = [("op", "aten.mm.default", "l", (4, 8)), ("op", "aten.add.Tensor", "l", (4, 8)),
             ("op", "aten.mul.Tensor", "l", (4, 8))]
    bench = block * 3000  # 9000 entries, no unique anchors: windowed DP
    target = [s for k, s in enumerate(block * 3000) if k % 300 != 7]  # 30 ops dropped
    pairs = _align(bench, target)
    assert len(pairs) == len(target)
    assert all(bench[i][1] == target[j][1] for i, j in pairs)


# -- bad input -------------------------------------------------------------------------------
def test_missing_corrupt_truncated_and_foreign_inputs(tmp_path, capsys):
    x = _x(8)
    good = write_dump(tmp_path / "good", [Op("aten.relu.default", x)])
    out = str(tmp_path / "o.csv")
    assert main([str(tmp_path / "nope"), str(good), out]) == 2
    assert "nope: no such file" in capsys.readouterr().err

    corrupt = write_dump(tmp_path / "corrupt", [Op("aten.relu.default", x)])
    (corrupt / "dump.json").write_text("{not json")
    assert main([str(good), str(corrupt), out]) == 2
    err = capsys.readouterr().err
    assert "target dump unusable" in err and "dump.json" in err and err.count("\n") == 1

    future = write_dump(tmp_path / "future", [Op("aten.relu.default", x)])
    data = json.loads((future / "dump.json").read_text())
    data["format_version"] = 99
    (future / "dump.json").write_text(json.dumps(data))
    assert main([str(good), str(future), out]) == 2
    assert "upgrade xray" in capsys.readouterr().err

    other = write_dump(tmp_path / "other", [Op("aten.relu.default", x)])
    data = json.loads((other / "dump.json").read_text())
    data["format"] = "xray-module"
    (other / "dump.json").write_text(json.dumps(data))
    assert main([str(good), str(other), out]) == 2
    assert "not an xray trace dump" in capsys.readouterr().err

    truncated = write_dump(tmp_path / "trunc", [Op("aten.relu.default", x)], finish=False)  # as if killed
    r = compare_dumps(good, truncated)
    assert r.rows[0].status == "pass" and any("not finalised" in w for w in r.summary.warnings)

    missing_data = write_dump(tmp_path / "nodata", [Op("aten.relu.default", x)])
    for seg in missing_data.glob("tensors-*.h5"):
        seg.write_bytes(b"garbage")
    row = compare_dumps(good, missing_data).rows[0]
    assert row.mode == "stats" and row.status == "pass" and "unreadable" in row.note


def test_fp64_reference_rule(tmp_path):
    ref = 1000 * _x(1000).double()  # values ~1e3: float32 rounding leaves an rms error ~2e-5
    bench = ref.float()
    small = (ref + 3e-3 * _x(1000, seed=3).double()).float()  # beyond rtol*|x| ~1.3e-3 for most elements
    big = (ref + 1.0 * _x(1000, seed=3).double()).float()
    r_dir = write_dump(tmp_path / "ref", [Op("aten.mm.default", ref)])
    a, b = _pair(tmp_path, [Op("aten.mm.default", bench)], [Op("aten.mm.default", small)])
    # small's error is ~150x the bench's own fp32 error; big's ~5e4x. A multiplier of 500 separates them.
    rules = Rules(fp64_multiplier=500.0)
    assert compare_dumps(a, b).rows[0].status == "warning"  # 3e-6 relative, spread: rounding-like
    row = compare_dumps(a, b, rules=rules, reference=r_dir).rows[0]
    assert row.status == "pass" and row.ref_err_target > row.ref_err_bench > 0 and "float64" in row.note
    b2 = write_dump(tmp_path / "c", [Op("aten.mm.default", big)])
    assert compare_dumps(a, b2, rules=rules, reference=r_dir).rows[0].status == "fail"


def test_zeros_beside_nonfinite_values_do_not_crash():
    """The finite part of a chunk holding NaN/Inf can be all zeros (a BERT attention mask row):
    its scaled sums divided by a zero scale (ZeroDivisionError in the accuracy benchmark)."""
    from xray.numerics.metrics import chunk_partial

    nan = float("nan")
    bench = torch.tensor([0.0, 0.0, nan, float("-inf")])
    part = chunk_partial(bench, bench.clone(), default_tolerance("float32"))
    assert part.numel == 4 and part.not_close == 0 and part.max_abs == 0.0


def test_statistics_rule_bands_on_one_pair():
    """numerics.stats_judge (compare's one statistics rule) on single pairs: the floor at the
    bench's RMS passes, up to stats_warn_factor floors warns, beyond fails; exact dtypes never
    warn; a NaN/Inf count that differs wins; a statistic on one side only fails; 1e200 stays finite."""
    from xray.dump.model import Stats
    from xray.numerics.stats_judge import judge_one

    rules, tol = Rules(), Tolerance(1.3e-6, 1e-5)
    bench = Stats(-2.0, 2.0, 0.0, 1.0, numel=1000)
    allowed = tol.floor(1.0) + tol.rtol * 2.0  # RMS 1, range 2: what one statistic may move

    def moved(k: float, **kw) -> Stats:
        return Stats(-2.0, 2.0, k * allowed, 1.0, numel=1000, **kw)

    assert judge_one(bench, moved(0.9), tol, rules)[0] == "pass"
    assert judge_one(bench, moved(5.0), tol, rules)[0] == "warning"
    assert judge_one(bench, moved(rules.stats_warn_factor * 1.5), tol, rules)[0] == "fail"
    assert judge_one(bench, moved(5.0), Tolerance(0.0, 0.0), rules)[0] == "fail"
    assert judge_one(bench, moved(0.0, nan=1), tol, rules)[0] == "nan/inf"
    assert judge_one(bench, Stats(-2.0, 2.0, 0.0, None, numel=1000), tol, rules)[0] == "fail"
    status, err = judge_one(Stats(1e200, 1.5e200, 1.2e200, 1e199, numel=4),
                            Stats(1e200, 1.5e200, 1.2e200 * (1 + 1e-9), 1e199, numel=4), tol, rules)
    assert status == "pass" and math.isfinite(err) and err == pytest.approx(2 * 0.5e-9 * 1.2e200 / 1.5e200, rel=1e-6)


def test_a_tolerance_floor_is_the_same_for_one_pair_and_for_a_column():
    """numerics.rules.floor_of is written once for numbers and arrays: Python's max/min choice
    (NaN never wins against the first) on both, so the per-pair path and the columns agree."""
    import numpy as np

    from xray.numerics.rules import floor_of

    scales = [0.0, -0.0, 0.5, 1.0, 2.0, 1e-30, 1e200, float("inf"), float("nan")]
    for tol in (Tolerance(1.3e-6, 1e-5), Tolerance(0.0, 0.0), Tolerance(1e-3, 0.0), Tolerance(0.0, 1e-5)):
        with np.errstate(all="ignore"):
            column = floor_of(np.full(len(scales), tol.rtol), np.full(len(scales), tol.atol), np.array(scales))
        for scale, got in zip(scales, column.tolist()):
            one = tol.floor(scale)
            assert one == got or (math.isnan(one) and math.isnan(got)), (tol, scale, one, got)
    assert Tolerance(1.3e-6, 1e-5).floor(0.5) == 0.5e-5 and Tolerance(1e-3, 1e-5).floor(100.0) == 0.2
    assert Tolerance(0.0, 0.0).floor(5.0) == 0.0
