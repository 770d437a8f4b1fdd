"""Attribution of the earliest failing rows (attribution_bound.py): past ``attribute_first``
failing rows, a run that diverged early keeps its verdict and first divergence, and the rows left
unattributed say so; a run with fewer failing rows is attributed in full."""
from __future__ import annotations

import csv
import random
from pathlib import Path

from xray.compare import cli, compare_dumps
from xray.dump.model import Record, Stats, TensorMeta
from xray.dump.writer import DumpWriter

OPS = ("aten.mm.default", "aten.add.Tensor", "aten.mul.Tensor", "aten.silu.default")
N = 48
ATTRIBUTION = ("status", "origin", "cause", "culprit", "inputs_agree", "culprit_target_seq")


def _chain(folder: Path, scale: float = 1.0, *, moved: float = 1.0, reborn: int | None = None) -> Path:
    """A stats-only trace of ``N`` ops, each fed by the one before; ``scale`` multiplies every
    output statistic from the first op on (every row fails). ``moved``: the second op reads its
    input that many times what the first wrote and the first op is left exact, so the rows after
    it carry an error within the precision factor of what they were fed (precision loss).
    ``reborn``: from that op on, the chain starts again from the model input, which agrees, so
    that op's own error is born there."""
    rng = random.Random(0)
    writer = DumpWriter(folder, {"pid": 0, "rank": None, "config": {}})
    start = Stats(min=-1.0, max=1.0, mean=0.0, std=0.5, numel=256)
    prev, source = start, "input"
    for seq in range(N):
        mean, std = rng.gauss(0.0, 0.1), rng.uniform(0.5, 2.0)
        f = 1.0 if seq == 0 and moved != 1.0 else scale
        if seq == reborn:
            prev, source = start, "input"
        if seq == 1 and moved != 1.0:
            prev = Stats(min=prev.min * moved, max=prev.max * moved, mean=prev.mean * moved, std=prev.std * moved,
                         numel=256)
        out = Stats(min=(mean - 4 * std) * f, max=(mean + 4 * std) * f, mean=mean * f, std=std * f, numel=256)
        rec = Record(seq=seq, kind="op", op=OPS[seq % len(OPS)], module=f"layers.{seq // 16}")
        rec.inputs = {"self": TensorMeta(shape=(4, 64), dtype="float32", stride=(64, 1), stats=prev, source=source)}
        rec.outputs = [TensorMeta(shape=(4, 64), dtype="float32", stride=(64, 1), stats=out)]
        writer.add(rec)
        prev, source = out, f"op:{seq}:0"
    writer.close({})
    return folder


def _attribution(rows) -> list[tuple]:
    return [tuple(getattr(r, k) for k in ATTRIBUTION) for r in rows]


def test_rows_past_the_bound_keep_the_verdict_and_say_they_were_not_attributed(tmp_path: Path) -> None:
    bench, target = _chain(tmp_path / "bench"), _chain(tmp_path / "fail", 1.5)
    every = compare_dumps(bench, target, progress=False, attribute_first=None)
    first = compare_dumps(bench, target, progress=False, attribute_first=10)
    assert every.status_counts() == first.status_counts() == {"fail": N}
    assert first.summary.first_divergence == every.summary.first_divergence
    assert first.summary.first_divergence["origin"] == "born"
    assert (first.summary.verdict_kind, first.summary.verdict) == (every.summary.verdict_kind, every.summary.verdict)
    assert _attribution(first.rows[:10]) == _attribution(every.rows[:10])
    assert all(r.cause and "not attributed" not in r.note for r in every.rows)
    for r in first.rows[10:]:
        assert (r.status, r.origin, r.cause) == ("fail", "", "")
        assert r.note.startswith("not attributed") and "--attribute-all" in r.note
        assert f"first 10 failing rows" in r.note and f"{N - 10} later" in r.note
    assert any("--attribute-all" in w and f"{N - 10} later failing rows" in w for w in first.summary.warnings)
    assert not any("attribute" in w for w in every.summary.warnings)


def test_a_run_with_no_more_failing_rows_than_the_bound_is_attributed_in_full(tmp_path: Path) -> None:
    bench, target = _chain(tmp_path / "bench"), _chain(tmp_path / "fail", 1.5)
    every = compare_dumps(bench, target, progress=False, attribute_first=None)
    assert every.status_counts() == {"fail": N}
    at_bound = compare_dumps(bench, target, progress=False, attribute_first=N)
    assert [r.to_dict() for r in at_bound.rows] == [r.to_dict() for r in every.rows]
    assert at_bound.summary.verdict == every.summary.verdict


def test_no_born_row_within_the_bound_attributes_every_row(tmp_path: Path) -> None:
    # the first failing rows carry a moved input's error on (precision loss, warnings once
    # attributed); the error born at op ``N - 8`` is the first divergence whatever the bound
    bench = _chain(tmp_path / "bench", reborn=N - 8)
    target = _chain(tmp_path / "fail", 1.5, moved=3.0, reborn=N - 8)
    every = compare_dumps(bench, target, progress=False, attribute_first=None)
    assert every.status_counts() == {"pass": 1, "warning": N - 9, "fail": 8}
    first = compare_dumps(bench, target, progress=False, attribute_first=4)
    fd = every.summary.first_divergence
    assert fd["origin"] == "born" and fd["bench_seq"] == N - 8, fd
    assert first.summary.first_divergence == fd
    assert first.summary.verdict == every.summary.verdict
    assert [r.to_dict() for r in first.rows] == [r.to_dict() for r in every.rows]


def test_the_cli_attributes_every_row_when_asked(tmp_path: Path, monkeypatch) -> None:
    bench, target = _chain(tmp_path / "bench"), _chain(tmp_path / "fail", 1.5)
    monkeypatch.setattr(cli, "ATTRIBUTED", 10)  # the default bound, small enough for this pair
    for flags, unattributed in (([], N - 10), (["--attribute-all"], 0)):
        out = tmp_path / f"out{len(flags)}.csv"
        assert cli.main([str(bench), str(target), str(out), "--no-progress", *flags]) == 0
        with open(out, newline="") as f:
            notes = [row["note"] for row in csv.DictReader(f)]
        assert sum("not attributed" in n for n in notes) == unattributed
