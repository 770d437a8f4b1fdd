"""Every argument of a call is compared, X_DUMP_NUM saves outputs, an unrecorded backward is said.

A dropped attention mask left q, k and v bit-identical and the target computing right on its own
arguments: compare called it "computed correctly on its inputs" (tensors saved) or a local error
(statistics only). An argument one side passes and the other does not, or another value of it, is
cause "argument" whatever the row's status; where tensors were saved the call is re-run with the
bench's arguments, so an argument spelled otherwise (scale=None for 1/sqrt(head size)) is none.
"""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from conftest import sweep_noise_run

import xray
from xray.compare import compare_dumps

SDPA = "aten._scaled_dot_product_flash_attention_for_cpu.default"


def _qkv(b=1, h=4, t=8, e=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, t, e, generator=g) for _ in range(3)]


def _record(folder, fn, **opts):
    with torch.no_grad(), xray.dump(dump_dir=folder, **opts) as d:
        fn()
    return d.folder


def _attention_pair(tmp_path, bench_kw, target_kw, target_noise=0.0, **opts):
    q, k, v = _qkv()
    noisy = [x * (1 + target_noise * torch.randn(x.shape, generator=torch.Generator().manual_seed(9)))
             for x in (q, k, v)]
    a = _record(tmp_path / "a", lambda: F.scaled_dot_product_attention(q, k, v, **bench_kw) * 2, **opts)
    b = _record(tmp_path / "b", lambda: F.scaled_dot_product_attention(*noisy, **target_kw) * 2, **opts)
    return compare_dumps(a, b)


def _sdpa_rows(r):
    return [row for row in r.rows if row.target_op == SDPA and row.tensor == "out0"]


def _mask():
    return torch.randn(1, 1, 8, 8, generator=torch.Generator().manual_seed(3))


def test_a_dropped_mask_with_tensors_saved_is_an_argument_not_precision(tmp_path):
    """Before: 0 FAIL rows, "computed correctly on its inputs"."""
    r = _attention_pair(tmp_path, {"attn_mask": _mask()}, {}, X_DEDUP=False, X_DUMP_NUM=100)
    (row,) = _sdpa_rows(r)
    assert row.status == "fail" and (row.origin, row.cause) == ("born", "argument"), (row.status, row.culprit)
    assert "attn_mask" in row.culprit and "computes right with its own arguments" in row.culprit, row.culprit
    fd = r.summary.first_divergence
    assert fd["cause"] == "argument" and r.summary.verdict_kind == "bug", r.summary.verdict


def test_a_dropped_mask_with_the_recorders_defaults_is_an_argument(tmp_path):
    """Before: "local error: inputs agree" (statistics) or "computed correctly" (saved): the mask unseen."""
    r = _attention_pair(tmp_path, {"attn_mask": _mask()}, {})
    (row,) = _sdpa_rows(r)
    assert (row.origin, row.cause) == ("born", "argument") and "attn_mask" in row.culprit, (row.cause, row.culprit)
    assert r.summary.first_divergence["cause"] == "argument"


def test_scale_none_is_the_default_it_stands_for_and_another_scale_is_named(tmp_path):
    """Statistics only: scale=None is 1/sqrt(16) = 0.25, so a target passing 0.25 (its rows within
    precision of the bench's) is no argument; 1.0 is, named with the value None stands for. Before:
    "argument scale differs: bench None, target 0.25" turned the precision-level row into a FAIL."""
    same = _attention_pair(tmp_path / "same", {}, {"scale": 0.25}, target_noise=1e-7, X_DEDUP=False, X_DUMP_NUM=0)
    assert same.summary.failed == 0 and same.summary.first_divergence is None, \
        [(row.target_op, row.cause, row.culprit) for row in same.rows if row.status == "fail"]
    wrong = _attention_pair(tmp_path / "wrong", {}, {"scale": 1.0}, X_DEDUP=False, X_DUMP_NUM=0)
    (row,) = _sdpa_rows(wrong)
    assert row.cause == "argument" and "bench 0.25, target 1" in row.culprit, row.culprit


def test_dump_num_saves_the_outputs_of_a_kernel_with_many_inputs(tmp_path):
    """An attention backward reads six tensors: X_DUMP_NUM=5 spent them all on its inputs before."""
    q, k, v = (x.requires_grad_() for x in _qkv())
    with xray.dump(dump_dir=tmp_path, X_DEBUG=0x10A, X_DEDUP=False, X_DUMP_NUM=5) as d:
        F.scaled_dot_product_attention(q, k, v).sum().backward()
    dump = xray.load_dump(d.folder)
    (bwd,) = [rec for rec in dump.records if rec.op.startswith("aten._scaled_dot_product_flash_attention_for_cpu_backward")]
    ins, outs = list(bwd.input_tensors()), list(bwd.output_tensors())
    assert len(ins) >= 6 and sum(m.data is not None for _, m in ins) == 5
    assert all(m.data is not None for _, m in outs), [n for n, m in outs if m.data is None]
    assert torch.equal(dump.load_tensor(outs[0][1]), q.grad)


def test_a_backward_that_ran_unrecorded_is_said_in_the_verdict(tmp_path):
    """The default X_DEBUG records no backward: "no row fails" then covers the forward only."""
    def step(folder, wrong):
        w = torch.nn.Parameter(torch.ones(4, 4))
        x, seed = torch.ones(2, 4), torch.tensor(2.0 if wrong else 1.0)  # a backward bug the forward never shows
        with xray.dump(dump_dir=folder, X_DEDUP=False) as d:  # X_DEBUG 0x102: no BACKWARD
            (x @ w).sum().backward(seed)
        return d.folder

    a, b = step(tmp_path / "a", False), step(tmp_path / "b", True)
    assert json.loads((a / "dump.json").read_text())["summary"]["unrecorded"]["backward_calls"] > 0
    r = compare_dumps(a, b)
    assert r.summary.verdict_kind == "precision" and "backward ran but was not recorded" in r.summary.verdict, \
        r.summary.verdict
    assert r.summary.to_json()["unrecorded_backward"]


@pytest.mark.slow  # 8-19 s on a busy 2-core CPU: two recordings, float64 re-runs of a 16x512x512 attention
@pytest.mark.real_size
def test_a_dropped_mask_at_a_real_size(tmp_path):
    """One attention layer's SDPA at hidden 1024 (16 heads of 64), 512 tokens, fp32, defaults."""
    q, k, v = _qkv(1, 16, 512, 64)
    mask = torch.randn(1, 1, 512, 512, generator=torch.Generator().manual_seed(3))
    a = _record(tmp_path / "a", lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask) * 2)
    b = _record(tmp_path / "b", lambda: F.scaled_dot_product_attention(q, k, v) * 2)
    r = compare_dumps(a, b)
    assert r.summary.first_divergence["cause"] == "argument" and r.summary.verdict_kind == "bug", r.summary.verdict




@pytest.mark.slow
def test_an_index_list_with_a_dimension_taken_whole_is_the_same_argument(tmp_path):
    """Switch Transformers under TF32 with the recorder's defaults: its experts gather their
    tokens with ``x[:, idx]``, ``index`` with indices [None, idx] on both sides. The None items
    are equal; they were read as an argument that "differs: bench none, target none", 7 FAIL
    rows in a noise-only run."""
    o = sweep_noise_run("switch_transformers", tmp_path, noise="tf32", backward=False)
    assert o.summary["failed"] == 0, o.summary["first_divergence"]


@pytest.mark.slow  # an untuned transformers architecture recorded twice: about 15 s
def test_an_argument_the_op_only_writes_is_not_paired_with_one_the_other_op_reads(tmp_path):
    """I-JEPA's embeddings hand their input gradient on through ``copy_(new_empty_strided(...), g)``
    in fp32 and through ``_to_copy(g, bfloat16)`` under autocast. Paired by name, the bench's
    ``self`` (the empty buffer, which copy_ only writes) stood for the target's ``self`` (the
    gradient it casts): the inputs read "unknown", and the row, which carries its input's
    precision loss, stayed a FAIL with no origin (the sweep's first run). An argument the op
    never reads is none of its inputs (``op_classes.overwritten_inputs``)."""
    o = sweep_noise_run("ijepa", tmp_path, noise="bf16", backward=True)
    assert o.summary["failed"] == 0, o.summary["first_divergence"]
