"""A float32 ``finfo.min`` mask fill is -3.40e38, past bfloat16's range: a bf16 run holds it as
-Inf, the correct rounding of that value. Saved data, statistics and samples all read the two as
one mask value (``metrics.infinity_stand_in``); a computed overflow stays a NaN/Inf mismatch."""
from __future__ import annotations

import numpy as np
import torch

import xray
from xray.compare import compare_dumps
from xray.numerics import sample_judge, stats_judge
from xray.numerics.metrics import infinity_stand_in
from xray.numerics.rules import Rules

FILL = torch.finfo(torch.float32).min


class MaskedAttention(torch.nn.Module):
    """Attention scores masked with float32's ``finfo.min`` whatever the scores' dtype (as
    Inkling's attention does), then the mask added to the scores again."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(width, width) for _ in range(3))

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        scores = self.q(x) @ self.k(x).transpose(-1, -2)
        mask = torch.where(keep, 0.0, FILL).to(scores.dtype)  # -Inf in bfloat16
        return torch.softmax((scores + mask).float(), -1) @ self.v(x).float()


def _compare(tmp_path, **flags):
    torch.manual_seed(0)
    model, x = MaskedAttention(), torch.randn(2, 32, 64)
    keep = torch.ones(32, 32, dtype=torch.bool).tril()
    folders = []
    for name, bf16 in (("fp32", False), ("bf16", True)):
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=bf16), \
                xray.dump(dump_dir=tmp_path / name, **flags) as d:
            model(x, keep)
        folders.append(d.folder)
    return compare_dumps(*folders)


def test_a_float32_mask_fill_held_as_inf_by_bf16_agrees_on_saved_data_and_statistics(tmp_path):
    for name, flags in (("data", {"X_DEDUP": False, "X_DUMP_NUM": 100}), ("stats", {"X_DUMP_NUM": 0})):
        result = _compare(tmp_path / name, **flags)
        masked = [r for r in result.rows if r.bench_op == "aten.add.Tensor"]  # scores + mask
        assert masked and masked[0].target_inf > 0 and masked[0].bench_inf == 0, masked
        bad = [(r.bench_name, r.status, r.note) for r in result.rows if r.status in ("fail", "nan/inf")]
        assert not bad and result.summary.first_divergence is None, (name, bad)


def test_a_stand_in_is_the_top_binade_of_a_range_computed_values_do_not_reach():
    assert infinity_stand_in(torch.float32, torch.bfloat16) == torch.finfo(torch.float32).max / 2
    assert infinity_stand_in(torch.float32, torch.float16) == torch.finfo(torch.float32).max / 2
    assert infinity_stand_in(torch.float16, torch.float16) is None  # activations reach 32768..65504
    assert infinity_stand_in(torch.float32, torch.float32) == torch.finfo(torch.float32).max / 2
    si = np.array([infinity_stand_in(torch.float32, torch.float16)])
    rules = Rules()

    def sample_verdict(b, t):
        got = sample_judge.judge(np.array([b]), np.array([t]), np.array([len(b)]), np.array([len(t)]),
                                 np.array([1e-3]), np.array([1e-5]), np.array([1.0]), np.array([np.nan]), rules, si)
        return int(got["verdict"][0])

    assert sample_verdict([FILL, 1.0, 2.0], [-np.inf, 1.0, 2.0]) == sample_judge.PASS
    assert sample_verdict([7e4, 1.0, 2.0], [np.inf, 1.0, 2.0]) == sample_judge.NAN_INF  # a float16 overflow
    assert sample_verdict([FILL, 1.0, 2.0], [np.inf, 1.0, 2.0]) == sample_judge.NAN_INF  # the other sign

    def stats_verdict(bench, target):
        cols = [stats_judge.columns_of([s]) for s in (bench, target)]
        return int(stats_judge.judge(*cols, np.array([1e-3]), np.array([1e-5]), rules, si)["verdict"][0])

    from xray.dump.model import Stats
    assert stats_verdict(Stats(FILL, 2.0, -1e37, 1e38, numel=10), Stats(0.5, 2.0, 1.2, 0.5, neginf=3, numel=10)) == \
        stats_judge.PASS
    assert stats_verdict(Stats(-5.0, 7e4, 1e4, 2e4, numel=10), Stats(-5.0, 2.0, 0.1, 2.0, posinf=1, numel=10)) == \
        stats_judge.NAN_INF


def test_a_bug_in_masked_scores_is_judged_at_the_scores_magnitude_not_the_fills(tmp_path):
    """Scores + mask, 1 % off in float32 with every tensor saved: the row's absolute floor came
    from its RMS, which the -3.4e38 fill made 1e38, so every score passed (the sweep's VaultGemma,
    a 1e-2 bug in its masked add named nowhere). Values that stand for infinity are left out of
    the scale; the bug is born at that add."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    from accuracy.faults import CorruptCall, relative

    torch.manual_seed(0)
    model, x = MaskedAttention(), torch.randn(2, 32, 64)
    keep = torch.ones(32, 32, dtype=torch.bool).tril()
    flags = {"X_DEDUP": False, "X_DUMP_NUM": 100}
    fault = CorruptCall("aten.add.Tensor", 0, relative(1e-2))
    folders = []
    for name, mode in (("clean", None), ("bug", fault)):
        with torch.no_grad(), mode or torch.no_grad(), xray.dump(dump_dir=tmp_path / name, **flags) as d:
            model(x, keep)
        folders.append(d.folder)
    assert fault.hit
    fd = compare_dumps(*folders).summary.first_divergence
    assert fd is not None and fd["op"] == "aten.add.Tensor" and fd["origin"] == "born", fd


def test_a_statistics_only_rows_sample_is_judged_at_its_values_not_the_fills():
    """A masked score recorded with statistics only: its RMS and peak from the statistics are the
    fill's (1e38), so any finite element passed. Where the bench's statistics reach a stand-in,
    the sample's elements below it set the scale and the peak (sample_judge._without_stand_ins):
    a 5 % bug in the finite part is beyond its floor (a uniform scaling is spread like rounding:
    a warning, which attribution then weighs), with its sample_err at the scores' magnitude, and
    bf16-like rounding of it still passes."""
    si = np.array([infinity_stand_in(torch.float32, torch.float32)])
    rng = np.random.default_rng(0)
    scores = rng.standard_normal(16)
    bench = np.concatenate([np.full(16, FILL), scores])
    rms_stats = float(np.sqrt(np.mean(bench ** 2)))  # what the statistics give: the fill's

    def verdict(target):
        got = sample_judge.judge(np.array([bench]), np.array([target]), np.array([32]), np.array([32]),
                                 np.array([1.6e-2]), np.array([1e-5]), np.array([rms_stats]),
                                 np.array([abs(FILL)]), Rules(), si)
        return int(got["verdict"][0]), float(got["sample_err"][0])

    code, err = verdict(np.concatenate([np.full(16, FILL), scores * 1.05]))
    assert code in (sample_judge.WARNING, sample_judge.FAIL) and 0.01 < err < 0.1, (code, err)
    rounded = torch.tensor(scores, dtype=torch.float32).to(torch.bfloat16).double().numpy()
    assert verdict(np.concatenate([np.full(16, FILL), rounded]))[0] == sample_judge.PASS
