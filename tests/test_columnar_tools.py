"""xray-summary, xray-gen, xray-replay's selection and ``xray info`` read a v3 dump's columns
(issue 21); each must give exactly what its record path gives on the same records, so the fast
path can never silently diverge. The record path runs on a record-backed twin of the dump
(``TraceDump(folder, header, list(dump.records), True)``), the columnar path on the dump itself
or, for the old JSON example dumps, on a columnar twin built from their records."""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch

import xray
from xray.cli import info_text
from xray.dump.column_scan import native_columns
from xray.dump import DumpFormatError
from xray.dump.column_builder import columns_of
from xray.dump.columns import Columns, StringTable
from xray.dump.reader import TraceDump
from xray.gen.blacklist import DEFAULT_BLACKLIST, Blacklist
from xray.gen.generator import generate, plan, plan_columns
from xray.replay.modules import TORCH_NN
from xray.replay.runner import ReplayConfig, select_records
from xray.summary.table import ColumnRow, SummaryRow, dump_rows, filter_rows, render_table, write_csv

EXAMPLES = Path(__file__).resolve().parent.parent / "dumps"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A fresh v3 dump: a tiny Llama's forward and backward with module records and saved
    tensors, then a few calls with NaN/Inf, in-place, list and multi-output ops."""
    from xray.demo.models import tiny_llama, token_batch

    torch.manual_seed(0)
    model, ids = tiny_llama(layers=1, hidden=32), token_batch()
    with xray.dump(X_DEBUG=0x11A, X_DEDUP=False, X_DUMP_NUM=2, dump_dir=tmp_path_factory.mktemp("v3")) as session:
        out = model(ids)
        (out.logits if hasattr(out, "logits") else out).float().pow(2).mean().backward()
        x = torch.randn(4, 5)
        (x / torch.tensor(0.0)).sum()
        y = x.clone()
        y.add_(1.0)
        torch.cat([x, y])
        torch.max(x, dim=1)
    dump = xray.load_dump(session.folder)
    assert native_columns(dump) is not None, "a fresh dump must be columnar"
    return dump


def _twins(dump) -> tuple:
    """(columnar, record-backed) versions of one dump."""
    if native_columns(dump) is None:  # an old JSON dump: records in memory
        return TraceDump(dump.folder, dump.header, None, True, columns=columns_of(dump.records)), dump
    return dump, TraceDump(dump.folder, dump.header, list(dump.records), True)


@pytest.fixture(params=["recorded", "llama-fp32", "llama-dedup", "llama-bf16-fault"])
def twins(request):
    if request.param == "recorded":
        dump = request.getfixturevalue("recorded")
    else:
        dump = xray.load_dump(EXAMPLES / request.param)
    col, rec = _twins(dump)
    assert native_columns(col) is not None and native_columns(rec) is None
    return col, rec


@pytest.mark.slow
def test_summary_rows_table_and_csv_match_the_record_path(twins):
    col, rec = twins
    assert isinstance(next(dump_rows(col)), ColumnRow) and isinstance(next(dump_rows(rec)), SummaryRow)
    assert render_table(dump_rows(col)) == render_table(dump_rows(rec))
    out = [io.StringIO(), io.StringIO()]
    assert write_csv(dump_rows(col), out[0]) == write_csv(dump_rows(rec), out[1])
    assert out[0].getvalue() == out[1].getvalue()
    for match in (r"out0", r"layers\.0", r"^<root>"):
        a = [r.cells(i, True) for i, r in enumerate(filter_rows(dump_rows(col), match=match))]
        assert a == [r.cells(i, True) for i, r in enumerate(filter_rows(dump_rows(rec), match=match))]


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
            and p.suffix != ".h5"}


@pytest.mark.slow
def test_gen_writes_the_same_suite(twins, tmp_path):
    col, rec = twins
    blacklist = Blacklist.load()
    for factory in ("random", "auto"):
        a = generate(col, tmp_path / f"col-{factory}", factory=factory, blacklist=blacklist)
        b = generate(rec, tmp_path / f"rec-{factory}", factory=factory, blacklist=blacklist)
        assert (a.tests, a.files, a.calls, dict(a.skipped), a.tensors_copied) == \
               (b.tests, b.files, b.calls, dict(b.skipped), b.tensors_copied)
        assert _tree(tmp_path / f"col-{factory}") == _tree(tmp_path / f"rec-{factory}")
        data = [sorted((tmp_path / f"{s}-{factory}" / "data").glob("*.h5")) for s in ("col", "rec")]
        assert [p.name for p in data[0]] == [p.name for p in data[1]]


@pytest.mark.parametrize("no_blacklist", [False, True])
def test_gen_plan_cases_match(twins, no_blacklist):
    col, rec = twins
    blacklist = Blacklist.load(None if no_blacklist else DEFAULT_BLACKLIST)
    try:
        cases, report = plan_columns(col.columns, blacklist)
    except Exception as e:  # noqa: BLE001 - an op the record path refuses too, with the same words
        with pytest.raises(type(e)) as again:
            plan(list(rec.records), blacklist)
        assert str(again.value) == str(e)
        return
    expected, report2 = plan(list(rec.records), blacklist)
    assert report == report2 and list(report.skipped) == list(report2.skipped)
    assert {op: [(c.record, c.kind, c.records, c.calls) for c in cs] for op, cs in cases.items()} == \
           {op: [(c.record, c.kind, c.records, c.calls) for c in cs] for op, cs in expected.items()}
    assert list(cases) == list(expected)


@pytest.mark.parametrize("options", [{}, {"dedup": False}, {"limit": 3}, {"ops": ["mm", "aten.add.*"]},
                                     {"modules": ["*layers.0*"]}, {"model": "pkg:factory"}, {"model": TORCH_NN},
                                     {"seqs": [1, 5, 7, 100]}, {"modules": ["*"], "dedup": False}])
def test_replay_selects_the_same_records(twins, options):
    col, rec = twins
    cfg = ReplayConfig(backends=[], out=Path("unused"), **options)
    assert select_records(col, cfg) == select_records(list(rec.records), cfg)


def test_info_matches_the_record_path(twins):
    col, rec = twins
    assert info_text(col, 5) == info_text(rec, 5)
    assert info_text(col, 100) == info_text(rec, 100)


# -- hand-made indexes: the fast path refuses, or groups, exactly as the record path -------------------

def _edited(dump, edit) -> tuple:
    """(columnar, record-path) twins of ``dump`` with its columns edited by ``edit(records, tensors,
    strings)``; the record path's records are built from the edited columns."""
    c = dump.columns
    records, tensors = c.records.copy(), c.tensors.copy()
    strings = StringTable([c.strings[i] for i in range(len(c.strings))])
    edit(records, tensors, strings)
    columns = Columns(records, tensors, strings).validate()
    col = TraceDump(dump.folder, dump.header, None, True, columns=columns)
    return col, TraceDump(dump.folder, dump.header, [columns.record(i) for i in range(len(columns))], True)


def _error_of(fn) -> str:
    with pytest.raises(DumpFormatError) as e:
        fn()
    return str(e.value)


def test_a_broken_record_is_refused_with_the_record_paths_error(recorded, tmp_path):
    def edit(records, tensors, strings):
        bad = strings.intern('{"inputs": [1], "outputs": []}')  # not a skeleton
        records["skeleton"][[7, 3]] = bad  # the first bad row is 3, whatever the scan order
    c = recorded.columns
    records, tensors = c.records.copy(), c.tensors.copy()
    strings = StringTable([c.strings[i] for i in range(len(c.strings))])
    edit(records, tensors, strings)
    bad = TraceDump(recorded.folder, recorded.header, None, True, columns=Columns(records, tensors, strings))
    expected = _error_of(lambda: list(bad.records))
    assert "record #3" in expected
    assert _error_of(lambda: list(dump_rows(bad))) == expected
    assert _error_of(lambda: plan_columns(bad.columns, Blacklist.load())) == expected
    assert _error_of(lambda: select_records(bad, ReplayConfig(backends=[], out=tmp_path))) == expected
    assert _error_of(lambda: info_text(bad)) == expected


def test_one_text_under_two_ids_still_groups_as_one(recorded, tmp_path):
    """A hand-made index may intern a shape (or an op) twice; records holding either id are one
    signature, as their Records are equal."""
    def edit(records, tensors, strings):
        for col, table in (("shape", tensors), ("dtype", tensors), ("op", records)):
            ids = table[col]
            twin = len(strings)
            strings.extend([strings[int(i)] for i in np.unique(ids)])
            remap = {int(i): twin + k for k, i in enumerate(np.unique(ids))}
            half = np.arange(len(ids)) % 2 == 1
            ids[half] = [remap[int(i)] for i in ids[half]]

    col, rec = _edited(recorded, edit)
    assert _tree_of_gen(col, tmp_path / "a") == _tree_of_gen(rec, tmp_path / "b")
    cfg = ReplayConfig(backends=[], out=tmp_path)
    assert select_records(col, cfg) == select_records(list(rec.records), cfg)
    assert info_text(col) == info_text(rec)


def _tree_of_gen(dump, out: Path) -> dict[str, bytes]:
    generate(dump, out, factory="random")
    return _tree(out)


def test_summary_csv_lines_quote_and_blank_as_csv_writer(recorded):
    """The CSV fast path spells lines itself: texts needing quotes, rows without statistics,
    absent statistics, NaN values and non-finite counts must come out as csv.writer's."""
    def edit(records, tensors, strings):
        tensors["data"][0] = strings.intern('file.h5:a,"b"')
        tensors["has_stats"][1] = 0
        tensors["absent"][2], tensors["absent"][3] = 1 | 4, 15
        tensors["min"][4], tensors["nan"][4], tensors["posinf"][5] = np.nan, 3, 1
        records["module"][0] = strings.intern("odd,module\nname")

    col, rec = _edited(recorded, edit)
    out = [io.StringIO(), io.StringIO()]
    write_csv(dump_rows(col), out[0])
    write_csv(dump_rows(rec), out[1])
    assert out[0].getvalue() == out[1].getvalue() and '"file.h5:a,""b"""' in out[0].getvalue()
    assert render_table(dump_rows(col)) == render_table(dump_rows(rec))


def test_gen_finds_op_records_on_the_kind_column(recorded, twins):
    from xray.gen.cli import _has_op_records

    col, rec = twins
    assert _has_op_records(col) and _has_op_records(rec)

    def only_modules(records, tensors, strings):
        records["kind"][:] = 1

    col, rec = _edited(recorded, only_modules)
    assert not _has_op_records(col) and not _has_op_records(rec)


# -- xray-summary's table: tabulate's "simple" layout, spelled directly ---------------------------------

_CELLS = [None, "", 0, 7, -12, 10**12, True, 0.0, -0.0, 0.1, -2.5, 1e-300, 1e300, 123456789.0, 1.0, 12345.0,
          float("nan"), float("inf"), float("-inf"), "True", "False", "1e5", "inf", " nan ", "-Infinity", "1,000",
          "1_000", "5", "-5", "2x3", "scalar", " padded ", "a,b", "-", "+", ".", "e", "1.5.2", "0x10", "3.25",
          "1e-07", "é", "tab\there", "<root>/aten.add.Tensor#3.self", "model.layers.0.mlp.Linear.0.forward.out0"]


def test_simple_table_is_tabulates():
    """``simple_table`` gives tabulate's text for every mixture of cell types it accepts (and
    declines the rest): columns drawn from random subsets of awkward values."""
    import random

    from tabulate import tabulate

    from xray.summary.table import SUMMARY_COLUMNS, simple_table

    rng = random.Random(0)
    for _ in range(600):
        pools = [rng.sample(_CELLS, rng.randint(1, 4)) for _ in SUMMARY_COLUMNS]
        body = [[rng.choice(pool) for pool in pools] for _ in range(rng.randint(1, 6))]
        expected = tabulate(body, headers=SUMMARY_COLUMNS, tablefmt="simple", floatfmt=".6g", disable_numparse=False)
        got = simple_table(body, SUMMARY_COLUMNS)
        foreign = any(v is True or v in ("é", "tab\there") for row in body for v in row)  # a bool, not ASCII...
        assert (got is None) == foreign, body
        assert got is None or got == expected, body
