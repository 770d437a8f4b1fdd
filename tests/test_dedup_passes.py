"""De-dup by pass: within the pass that makes a key's first record (one outermost module call and
what follows it), every call of the key keeps a record, up to ``dedup_pass_records``; it folds
from the next pass on (docs/format.md, "De-duplication").

The sweep's TF32 training steps found why (FalconMamba's scan, MiniMax's blocked attention,
Persimmon's rotary products): a loop inside one forward folded from its third step, and compare,
finding an error carried out of a folded step, could not place it: FAIL rows in noise-only runs
that every call recorded clean."""
from __future__ import annotations

import pytest
import torch
from conftest import sweep_noise_run

import xray


class Scan(torch.nn.Module):
    """A recurrence inside one forward: ``steps`` turns of the same two ops, fed alike."""

    def __init__(self, steps: int) -> None:
        super().__init__()
        self.steps = steps
        self.decay = torch.nn.Parameter(torch.full((16,), 0.9))

    def forward(self, x):
        h = torch.zeros_like(x[:, 0])
        for t in range(self.steps):
            h = h * self.decay + x[:, t % x.shape[1]]
        return h


def _mul_records(folder) -> list:
    return [r for r in xray.load_dump(folder).records if r.op == "aten.mul.Tensor"]


def _record(tmp_path, model, forwards: int, **options):
    x = torch.randn(2, 8, 16)
    with torch.no_grad(), xray.dump(dump_dir=tmp_path / "d", X_DUMP_NUM=0, **options) as d:
        for _ in range(forwards):
            model(x)
    return d.folder


def test_a_loops_steps_keep_a_record_each_in_the_first_pass_and_fold_from_the_next(tmp_path):
    muls = _mul_records(_record(tmp_path, Scan(10), forwards=3))
    # pass 1: a record per step (the first step's key, fed by zeros_like, and the later nine
    # steps' key, fed by the mul before it); passes 2 and 3: the first step's key gets its second
    # record, which the third folds into; the loop's key folds whole into its last record
    assert len(muls) == 11 and sum(r.count for r in muls) == 30
    assert [r.count for r in muls] == [1] * 9 + [19, 2]


def test_a_pass_keeps_at_most_dedup_pass_records_of_a_key(tmp_path):
    muls = _mul_records(_record(tmp_path, Scan(100), forwards=1, dedup_pass_records=16))
    assert sum(r.count for r in muls) == 100 and len(muls) == 1 + 16  # the 84 later steps fold


def test_one_record_per_pass_restores_folding_from_the_third_call(tmp_path):
    muls = _mul_records(_record(tmp_path, Scan(10), forwards=1, dedup_pass_records=1))
    assert len(muls) == 1 + 2 and sum(r.count for r in muls) == 10


def test_a_session_without_module_calls_is_one_pass(tmp_path):
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with xray.dump(dump_dir=tmp_path / "d", X_DUMP_NUM=0, dedup_pass_records=8) as d:
        x = a
        for _ in range(20):
            x = x * b
    muls = _mul_records(d.folder)
    assert sum(r.count for r in muls) == 20 and len(muls) == 1 + 8


def test_the_header_says_how_many_records_a_pass_keeps(tmp_path):
    folder = _record(tmp_path, Scan(3), forwards=1, dedup_pass_records=5)
    config = xray.load_dump(folder).header["config"]
    assert config["dedup_pass_records"] == 5 and config["dedup_records"] == 2


def test_a_bad_dedup_pass_records_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("X_DEDUP_PASS_RECORDS", "0")
    with pytest.raises(ValueError, match="X_DEDUP_PASS_RECORDS"):
        xray.begin_dump(dump_dir=tmp_path / "d")


@pytest.mark.slow  # two transformers models' TF32 training steps recorded twice: about a minute
@pytest.mark.parametrize("model_type", ["falcon_mamba", "minimax"])
def test_a_tf32_training_step_through_a_loop_has_no_fail_with_the_defaults(model_type, tmp_path):
    """FalconMamba's selective scan and MiniMax's blocked linear attention loop inside one
    forward; with a loop's steps folded from the third, a TF32 training step had 1 and 188 FAIL
    rows (inherited from a folded bmm or mul, origin unplaceable), every call none."""
    o = sweep_noise_run(model_type, tmp_path, noise="tf32", backward=True)
    assert o.summary["failed"] == 0, o.summary["first_divergence"]
