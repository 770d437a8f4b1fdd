"""Compare's one path on columns: rows, verdicts and first divergence on real recorded dumps.

Every dump is compared on columns: a format-v3 dump's own index, or columns built from its
Records (JSON and module dumps; xray.dump.dump_columns). Each test compares a pair both ways, the
dumps as written and the same dumps with their Records held as a list, and requires the same rows
field for field (the built columns and the native ones say the same), then checks the verdicts
the injected fault or setup must give.
"""
from __future__ import annotations

import math

import pytest
import torch
from conftest import ScaleNthMM as PerturbNthMM
from test_compare import _run

import xray
from xray.compare import compare_dumps
from xray.compare.divergence import first_divergence
from xray.compare.engine import compare_loaded
from xray.demo.models import tiny_llama
from xray.dump import column_scan, dump_columns
from xray.dump.column_scan import native_columns
from xray.dump.reader import TraceDump
from xray.numerics.rules import Rules


def _record_backed(dump: TraceDump) -> TraceDump:
    return TraceDump(dump.folder, dump.header, list(dump.records), dump.complete, dump.summary)


def _same(x, y) -> bool:
    return x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))


def compare_both_ways(bench, target, rules: Rules | None = None) -> tuple[list, dict]:
    """Rows and totals of ``bench`` vs ``target``, checked equal to those of the same dumps
    compared on columns built from their Records."""
    rules = rules or Rules()
    db, dt = xray.load_dump(bench), xray.load_dump(target)
    assert native_columns(db) is not None and native_columns(dt) is not None
    rows, totals = compare_loaded(db, dt, rules, rank="r")
    rb, rt = _record_backed(db), _record_backed(dt)
    assert native_columns(rb) is None and native_columns(rt) is None
    built_rows, built_totals = compare_loaded(rb, rt, rules, rank="r")
    totals.pop("seconds"), built_totals.pop("seconds")
    assert totals == built_totals
    assert len(rows) == len(built_rows)
    for got, want in zip(rows, built_rows):
        diff = {k: (getattr(got, k), getattr(want, k)) for k in got.__dataclass_fields__
                if not _same(getattr(got, k), getattr(want, k))}
        assert not diff, f"row {want.index}: {diff}"
    return rows, totals


def _mm_seqs(folder) -> list[int]:
    return [r.seq for r in xray.load_dump(folder).records if r.op == "aten.mm.default"]


@pytest.fixture(scope="module")
def model():
    return tiny_llama(layers=2, hidden=32)


def _born_at_the_perturbed_mm(rows: list, target, n: int) -> None:
    """The first divergence is the n-th mm, born there; every row before it passes."""
    fd = first_divergence(rows)
    assert fd is not None and fd.origin == "born" and fd.bench_op == "aten.mm.default"
    assert fd.target_seq == _mm_seqs(target)[n - 1]
    assert all(r.status == "pass" for r in rows[:fd.index])


def test_stats_only_fault(tmp_path, model):
    bench = _run(model, tmp_path / "a", X_DUMP_NUM=0)
    target = _run(model, tmp_path / "b", X_DUMP_NUM=0, perturb=PerturbNthMM(3))
    rows, totals = compare_both_ways(bench, target)
    assert totals["matched"] == totals["bench_records"] == totals["target_records"]
    assert {r.mode for r in rows} <= {"stats", ""} and totals["bytes_compared"] == 0  # nothing saved
    _born_at_the_perturbed_mm(rows, target, 3)


@pytest.mark.slow
def test_saved_data_and_a_renamed_module(tmp_path, model):
    """Pairs with saved data go through PairComparer; a renamed class leaves the shortcut of
    identical structure, so anchors and gap scores are built from the arrays."""
    bench = _run(model, tmp_path / "a", X_DUMP_NUM=100)
    mlp = model.model.layers[1].mlp
    cls = type(mlp)
    mlp.__class__ = type("RenamedLlamaMLP", (cls,), {})
    try:
        target = _run(model, tmp_path / "b", X_DUMP_NUM=100, perturb=PerturbNthMM(5))
    finally:
        mlp.__class__ = cls
    rows, totals = compare_both_ways(bench, target)
    assert {r.mode for r in rows} >= {"data"} and totals["bytes_compared"] > 0
    renamed = [r for r in rows if r.target_op == "RenamedLlamaMLP"]
    assert renamed and all(r.bench_op == "LlamaMLP" for r in renamed)
    _born_at_the_perturbed_mm(rows, target, 5)


def test_autocast_target_adds_ops_and_changes_dtypes(tmp_path, model):
    """Unmatched target-only casts, mixed dtypes (the precision floor, upcasting notes): bf16
    autocast is precision loss, never a bug."""
    bench = _run(model, tmp_path / "fp32", X_DEBUG=0x102, X_DUMP_NUM=0)
    target = _run(model, tmp_path / "bf16", autocast=True, X_DEBUG=0x102, X_DUMP_NUM=0)
    rows, _ = compare_both_ways(bench, target)
    assert any(r.status == "unmatched" and r.note == "only in target" for r in rows)
    assert any("upcasting" in r.note for r in rows)
    assert not any(r.status == "fail" and r.origin == "born" for r in rows)


def test_mixed_dtype_statistics_are_judged_on_columns_as_pair_by_pair(tmp_path, model, monkeypatch):
    """A bf16 target of a float32 bench, statistics only: the columns' judge takes the mixed-dtype
    pairs (half of an autocast compare) and gives each row, note included, what
    PairComparer.compare gives it alone."""
    from xray.compare import engine

    bench = _run(model, tmp_path / "fp32", X_DEBUG=0x102, X_DUMP_NUM=0)
    target = _run(model, tmp_path / "bf16", autocast=True, X_DEBUG=0x102, X_DUMP_NUM=0)
    db, dt = xray.load_dump(bench), xray.load_dump(target)
    on_columns, _ = compare_loaded(db, dt, Rules(), rank="r")
    covered = engine.covered_by_stats
    monkeypatch.setattr(engine, "covered_by_stats", lambda *a: covered(*a) & False)  # every pair alone
    one_by_one, _ = compare_loaded(db, dt, Rules(), rank="r")
    mixed = [r for r in on_columns if r.mode == "stats" and r.bench_dtype != r.target_dtype]
    assert mixed and all("upcasting" in r.note for r in mixed)
    for got, want in zip(on_columns, one_by_one, strict=True):
        diff = {k: (getattr(got, k), getattr(want, k)) for k in got.__dataclass_fields__
                if not _same(getattr(got, k), getattr(want, k))}
        assert not diff, f"row {want.index}: {diff}"


def test_extra_target_records_and_nonfinite_statistics(tmp_path):
    """A target that runs one more block (unmatched records on one side) and NaN/Inf values."""
    torch.manual_seed(0)
    bench_model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    target_model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8),
                                       torch.nn.Linear(8, 4))
    x = torch.randn(4, 8)
    x[0, 0] = float("nan")
    for m, folder in ((bench_model, tmp_path / "a"), (target_model, tmp_path / "b")):
        with torch.no_grad(), xray.dump(dump_dir=folder, X_DEDUP=False, X_DUMP_NUM=0, X_DEBUG=0x112) as d:
            m(x)
        if m is bench_model:
            bench = d.folder
        else:
            target = d.folder
    rows, totals = compare_both_ways(bench, target)
    assert totals["target_records"] > totals["bench_records"]
    assert any(r.status == "unmatched" and r.note == "only in target" for r in rows)
    assert not any(r.note == "only in bench" for r in rows)
    assert any((r.bench_nan or 0) > 0 and (r.target_nan or 0) > 0 for r in rows)


def test_compare_dumps_summary_is_the_same_on_built_columns(tmp_path, model, monkeypatch):
    bench = _run(model, tmp_path / "a", X_DUMP_NUM=0)
    target = _run(model, tmp_path / "b", X_DUMP_NUM=0, perturb=PerturbNthMM(2))
    native = compare_dumps(bench, target)
    monkeypatch.setattr(column_scan, "native_columns", lambda dump: None)
    monkeypatch.setattr(dump_columns, "native_columns", lambda dump: None)
    built = compare_dumps(bench, target)
    native.summary.seconds = built.summary.seconds = 0
    for r in native.summary.ranks.values():
        r.pop("seconds")
    for r in built.summary.ranks.values():
        r.pop("seconds")
    assert native.summary == built.summary
    assert [r.to_dict() for r in native.rows] == [r.to_dict() for r in built.rows]
    fd = native.summary.first_divergence
    assert fd["origin"] == "born" and fd["target_seq"] == _mm_seqs(target)[1]


def test_random_ops_and_their_modules(tmp_path):
    """Dropout in training mode: its rows and those of the modules around it are skipped as
    random; what consumes the mask inherits the difference. (The seeds differ when the models
    are built: the biases differ, so the Linears are born failing on their parameters.)"""
    folders = []
    for side in ("a", "b"):
        torch.manual_seed(0 if side == "a" else 1)  # different masks
        m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 4)).train()
        torch.manual_seed(0)
        m[0].weight.data.normal_(), m[2].weight.data.normal_()
        with torch.no_grad(), xray.dump(dump_dir=tmp_path / side, X_DEDUP=False, X_DUMP_NUM=0, X_DEBUG=0x112) as d:
            m(torch.ones(4, 8))
        folders.append(d.folder)
    rows, _ = compare_both_ways(*folders)
    assert any(r.status == "skip" and "random" in r.note for r in rows)
    assert any(r.status == "skip" and "a random op ran inside it" in r.note for r in rows)
    assert [(r.status, r.origin) for r in rows if r.bench_op == "aten.mul.Tensor"] == [("fail", "inherited")]
    assert {r.cause for r in rows if r.origin == "born"} == {"parameter"}
