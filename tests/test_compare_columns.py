"""The columnar compare (xray/compare/columnar.py) must give the record path's rows, field for field.

Format-v3 dumps are compared on their columns; the same dumps with their records held as a list
(``TraceDump(folder, header, list(dump.records), True)``) go through the record path that
builds an Entry per record and judges every pair with ``PairComparer.compare``. Any difference,
in any field of any row, is a bug of the fast path.
"""
from __future__ import annotations

import math

import pytest
import torch
from conftest import ScaleNthMM as PerturbNthMM
from test_compare import _run

import xray
from xray.compare import compare_dumps
from xray.dump import column_scan
from xray.dump.column_scan import native_columns
from xray.compare.engine import compare_loaded
from xray.demo.models import tiny_llama
from xray.dump.reader import TraceDump
from xray.numerics.rules import Rules


def _record_backed(dump: TraceDump) -> TraceDump:
    return TraceDump(dump.folder, dump.header, list(dump.records), dump.complete, dump.summary)


def _same(x, y) -> bool:
    return x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))


def assert_paths_agree(bench, target, rules: Rules | None = None) -> list:
    """Compare ``bench`` and ``target`` on both paths; return the columnar rows."""
    rules = rules or Rules()
    db, dt = xray.load_dump(bench), xray.load_dump(target)
    assert native_columns(db) is not None and native_columns(dt) is not None
    rows, totals = compare_loaded(db, dt, rules, rank="r")
    rb, rt = _record_backed(db), _record_backed(dt)
    assert native_columns(rb) is None and native_columns(rt) is None
    ref_rows, ref_totals = compare_loaded(rb, rt, rules, rank="r")
    totals.pop("seconds"), ref_totals.pop("seconds")
    assert totals == ref_totals
    assert len(rows) == len(ref_rows)
    for got, want in zip(rows, ref_rows):
        diff = {k: (getattr(got, k), getattr(want, k)) for k in got.__dataclass_fields__
                if not _same(getattr(got, k), getattr(want, k))}
        assert not diff, f"row {want.index}: {diff}"
    return rows


@pytest.fixture(scope="module")
def model():
    return tiny_llama(layers=2, hidden=32)


def test_stats_only_fault(tmp_path, model):
    bench = _run(model, tmp_path / "a", X_DUMP_NUM=0)
    target = _run(model, tmp_path / "b", X_DUMP_NUM=0, perturb=PerturbNthMM(3))
    rows = assert_paths_agree(bench, target)
    assert {r.status for r in rows} >= {"pass", "fail"} and any(r.origin == "born" for r in rows)


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
    rows = assert_paths_agree(bench, target)
    assert {r.mode for r in rows} >= {"data"}


def test_autocast_target_adds_ops_and_changes_dtypes(tmp_path, model):
    """Unmatched target-only casts, mixed dtypes (the precision floor, upcasting notes)."""
    bench = _run(model, tmp_path / "fp32", X_DEBUG=0x102, X_DUMP_NUM=0)
    target = _run(model, tmp_path / "bf16", autocast=True, X_DEBUG=0x102, X_DUMP_NUM=0)
    rows = assert_paths_agree(bench, target)
    assert any(r.status == "unmatched" for r in rows) and any("upcasting" in r.note for r in rows)


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
    assert_paths_agree(bench, target)


def test_compare_dumps_of_v3_dumps_matches_the_record_path_summary(tmp_path, model, monkeypatch):
    bench = _run(model, tmp_path / "a", X_DUMP_NUM=0)
    target = _run(model, tmp_path / "b", X_DUMP_NUM=0, perturb=PerturbNthMM(2))
    fast = compare_dumps(bench, target)
    monkeypatch.setattr(column_scan, "native_columns", lambda dump: None)
    slow = compare_dumps(bench, target)
    fast.summary.seconds = slow.summary.seconds = 0
    for r in fast.summary.ranks.values():
        r.pop("seconds")
    for r in slow.summary.ranks.values():
        r.pop("seconds")
    assert fast.summary == slow.summary
    assert [r.to_dict() for r in fast.rows] == [r.to_dict() for r in slow.rows]


def test_random_ops_and_their_modules(tmp_path):
    """Dropout in training mode: random rows are skipped, on both paths alike."""
    folders = []
    for side in ("a", "b"):
        torch.manual_seed(0 if side == "a" else 1)  # different masks
        m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 4)).train()
        torch.manual_seed(0)
        m[0].weight.data.normal_(), m[2].weight.data.normal_()
        with torch.no_grad(), xray.dump(dump_dir=tmp_path / side, X_DEDUP=False, X_DUMP_NUM=0, X_DEBUG=0x112) as d:
            m(torch.ones(4, 8))
        folders.append(d.folder)
    rows = assert_paths_agree(*folders)
    assert any(r.status == "skip" and "random" in r.note for r in rows)
