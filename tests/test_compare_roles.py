"""Compare pairs calls by the role they play, on models the project never saw.

- A parallel residual (GPT-NeoX, Phi, codegen: ``x + attn(ln1(x)) + mlp(ln2(x))``): two adds of
  one fp32 signature in one module, fed by different producers, so de-dup keeps a record of each
  (encode.dedup_key's roles); under bf16 autocast their signatures differ too. Where the two sides
  fold differently, compare pairs a record with the call whose data edges it shares (matching.py,
  ``Roles``), never with another.
- The first divergence: NaN/Inf on one side only (an fp16 overflow) that ran before the row
  otherwise picked is named instead (divergence.py).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from conftest import record_forward, sweep_noise_run

from xray.compare import compare_dumps

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from accuracy.faults import CorruptCall, spike  # noqa: E402

FAILING = ("fail", "nan/inf")


def _fails(result) -> list:
    return [r for r in result.rows if r.status in FAILING]


def _op_records(folder, op: str, module: str) -> list[int]:
    """Seqs of ``op``'s records that ran in ``module``, in order."""
    import xray

    with xray.load_dump(folder) as d:
        return [r.seq for r in d.records if r.kind == "op" and r.op == op and r.module == module]


@pytest.fixture(scope="module")
def neox(tmp_path_factory):
    """A tiny GPT-NeoX with a parallel residual, its fp32 forward recorded with the defaults."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPTNeoXConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=32, use_parallel_residual=True)
    model = transformers.GPTNeoXForCausalLM(cfg).eval()
    ids = torch.randint(0, 64, (1, 8))
    folder = tmp_path_factory.mktemp("neox")
    return model, ids, folder, record_forward(model, folder / "fp32", ids)


def test_parallel_residual_fp32_against_bf16_has_no_fail(neox):
    """Layer 0's residual adds: two fp32 records (one signature, other producers) against two
    bf16 ones (bf16 + bf16, then + the fp32 residual), each paired with its own: no FAIL row on a
    clean forward."""
    model, ids, folder, bench = neox
    result = compare_dumps(bench, record_forward(model, folder / "bf16", ids, autocast=True))
    assert not _fails(result), [(r.target_op, r.module, r.cause) for r in _fails(result)]


@pytest.mark.parametrize("call, layer, which", [(4, 0, 1), (7, 1, 0)])
def test_a_fault_in_a_residual_add_is_named(neox, call, layer, which):
    """add.Tensor calls 3, 4 and 7, 8 are the two layers' residual adds: a spike in either layer's
    is named as the first divergence (the faulty call, or the call it reached first)."""
    model, ids, folder, bench = neox
    fault = CorruptCall("aten.add.Tensor", call, spike(8.0))
    target = record_forward(model, folder / f"bug{call}", ids, fault=fault, autocast=True)
    assert fault.hit
    truth = _op_records(target, "aten.add.Tensor", f"gpt_neox.layers.{layer}")[which]
    fd = compare_dumps(bench, target).summary.first_divergence
    assert fd is not None and truth in (fd["target_seq"], fd["culprit_target_seq"]), fd


# -- the first divergence: NaN/Inf on one side wins over a later FAIL ------------------------------
def _row(seq: int, status: str, origin: str, cause: str = "", **kw):
    from xray.compare.result import CompareRow

    return CompareRow(index=seq, status=status, origin=origin, cause=cause, bench_seq=seq, target_seq=seq, **kw)


def test_the_first_inf_on_one_side_wins_over_a_later_born_fail():
    """An fp16 overflow: Inf appears at seq 5 on the target only (its inputs already differ by
    fp16's rounding, so it is inherited), and a later layer's row is judged born. The run broke
    at seq 5: that row is the first divergence, with its cause."""
    from xray.compare.divergence import first_divergence

    rows = [_row(1, "warning", ""), _row(5, "nan/inf", "inherited", "inherited", culprit="input self from #4"),
            _row(6, "nan/inf", "inherited", "inherited"), _row(12, "fail", "born", "local error")]
    fd = first_divergence(rows)
    assert fd.target_seq == 5 and fd.cause == "inherited"
    rows[1].cause = ""  # a row causality left without a cause still says why it was picked
    assert first_divergence(rows).cause == "nan/inf"
    # a born failure before the first Inf keeps its place
    assert first_divergence([_row(3, "fail", "born", "local error")] + rows).target_seq == 3


def test_fp16_overflow_first_divergence_is_at_the_first_inf(tmp_path):
    """A toy MLP whose second linear overflows fp16 (its weight scaled), fp32 against fp16 with
    the defaults: the first divergence is at (or before) the first row holding an Inf."""
    import copy

    import xray

    torch.manual_seed(0)
    layers = []
    for i in range(6):
        layers += [torch.nn.Linear(32, 32), torch.nn.LayerNorm(32) if i % 2 else torch.nn.GELU()]
    model = torch.nn.Sequential(*layers).eval()
    with torch.no_grad():
        model[2].weight.mul_(3e5)
    x = torch.randn(4, 32)

    def record(m, inp, name):
        with torch.no_grad(), xray.dump(dump_dir=tmp_path / name) as d:
            m(inp)
        return d.folder

    result = compare_dumps(record(model, x, "fp32"), record(copy.deepcopy(model).half(), x.half(), "fp16"))
    first_inf = min(r.target_seq for r in result.rows if r.status == "nan/inf")
    fd = result.summary.first_divergence
    assert fd is not None and fd["target_seq"] <= first_inf and fd["cause"], fd


@pytest.mark.slow  # an untuned transformers architecture recorded twice: about 10 s
def test_roles_refuse_a_pair_only_on_arguments_both_sides_know(tmp_path):
    """ESM-C's attention with the defaults, fp32 against bf16 autocast: de-dup folds the key's
    rotary chain into the query's records, so the bench knows its attention's query producer and
    the target, whose query reaches it through a folded cast, knows its value's. "Both know a
    producer and share none" refused the pair: every attention was left unmatched on both sides,
    a blind spot for any bug in it. Producers are now compared where both sides know the same
    argument's; here none is, so the attentions pair and every bench record is matched."""
    o = sweep_noise_run("esmc", tmp_path, noise="bf16", backward=False)
    assert o.summary["unmatched_bench"] == 0 and o.summary["failed"] == 0, o.summary


def _slices(starts: list[int], path_sim: str = "layers.0.self_attn"):
    """Features of strided slice-backward calls of one shape, told apart only by their start."""
    import numpy as np

    from xray.compare.matching import Features

    n = len(starts)
    same = np.zeros(n, dtype=np.int64)
    return Features.of_arrays(group=same, op=same, path=same, shape=same, base=same, perm=same, numel=same,
                              dtype=same, args=np.array(starts, dtype=np.int64), module=np.zeros(n, dtype=bool),
                              paths=[path_sim] * n, ops=["aten.slice_backward.default"] * n)


def test_arguments_that_tell_twins_apart_overrule_a_producer_pairing():
    """Mistral-Large-4's bf16 training step with the defaults: a rotary half's two strided
    ``slice_backward`` calls (start 1, start 0) on both sides. The bench's first reads an add that
    paired with the target's other add (de-dup keeps two records of that key, and the sides' two
    are not the same two calls); its second reads a folded call. Producers refused the right pair,
    and start 0 paired with start 1: a FAIL row, "argument start differs". The start itself names
    each call; equal arguments that tell twins apart overrule the producers (matching.told_apart)."""
    import numpy as np

    from xray.compare.matching import Roles, align_features

    bench, target = _slices([1, 0]), _slices([1, 0])
    # bench 0 reads what pairs with the target's call 7; target 0 reads call 8: "other roles"
    role = Roles(np.array([[7, -1], [-1, -1]]), np.array([[8, -1], [9, -1]]))
    keys = [("k",), ("k",)]  # not unique: no anchors
    assert align_features(bench, target, keys, keys, role).pairs == [(0, 0), (1, 1)]


def test_producers_still_decide_between_twins_with_equal_arguments():
    """A parallel residual's two adds have one signature and equal arguments: producers alone tell
    them apart, so a pair whose producers disagree is still refused."""
    import numpy as np

    from xray.compare.matching import Roles, align_features

    bench, target = _slices([0]), _slices([0, 0])
    role = Roles(np.array([[8, -1]]), np.array([[7, -1], [8, -1]]))
    keys_a, keys_b = [("k",)], [("k",), ("k",)]
    assert align_features(bench, target, keys_a, keys_b, role).pairs == [(0, 1)]


@pytest.mark.slow  # an untuned transformers architecture's training step recorded twice: about 7 s
def test_a_rotary_halfs_slices_pair_by_their_start(tmp_path):
    """Mistral-Large-4's bf16 training step with the defaults (the case above, end to end): no
    FAIL row (1 before: a ``slice_backward`` of start 0 paired with one of start 1)."""
    o = sweep_noise_run("mistral_large4_text", tmp_path, noise="bf16", backward=True)
    assert o.summary["failed"] == 0, o.summary["first_divergence"]
