"""compare --statistics-only: dumps with saved tensors judged as statistics-only recordings of the
same runs would be (what a device's cheap recording will be told), their files untouched.

A statistics-only recording of the same run (X_DUMP_NUM=0) is the yardstick: the flag must give
its verdicts, on trace and on module dumps, and still name a scaling bug.
"""
from __future__ import annotations

import csv
import hashlib

import pytest
import torch
from conftest import ScaleNthMM, record_forward

import xray
from xray.compare import compare_dumps
from xray.compare.cli import main as compare_main


def _digest(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def runs(llama, tokens, tmp_path_factory):
    root = tmp_path_factory.mktemp("statistics_only")
    out = {}
    for saved in (64, 0):
        kw = dict(X_DEBUG=0x102, X_DEDUP=False, X_DUMP_NUM=saved)
        out[saved] = (record_forward(llama, root / f"bench{saved}", tokens, **kw),
                      record_forward(llama, root / f"target{saved}", tokens, fault=ScaleNthMM(3, 1.001), **kw))
    return out


def _verdict(result):
    fd = result.summary.first_divergence or {}
    return result.status_counts(), fd.get("target_seq"), fd.get("origin")


@pytest.mark.slow
def test_the_flag_judges_saved_tensors_as_a_statistics_only_recording_is_judged(runs):
    (bench, target), (bench0, target0) = runs[64], runs[0]
    before = _digest(target)
    flagged = compare_dumps(bench, target, statistics_only=True)
    recorded = compare_dumps(bench0, target0)
    assert _verdict(flagged) == _verdict(recorded)
    assert flagged.summary.first_divergence["origin"] == "born"  # the bug, named on statistics alone
    assert [r.mode for r in flagged.rows] == [r.mode for r in recorded.rows]
    assert "stats" in {r.mode for r in flagged.rows} and "data" not in {r.mode for r in flagged.rows}
    assert flagged.summary.bytes_compared == 0
    assert _digest(target) == before  # nothing written into the dump
    with_data = compare_dumps(bench, target)
    assert "data" in {r.mode for r in with_data.rows} and with_data.summary.bytes_compared > 0


def test_the_cli_flag_writes_the_statistics_verdict(runs, tmp_path, capsys):
    bench, target = runs[64]
    out = tmp_path / "rows.csv"
    assert compare_main([str(bench), str(target), str(out), "--statistics-only", "--no-progress"]) == 0
    with open(out, newline="") as f:
        modes = {row["mode"] for row in csv.DictReader(f)}
    assert "stats" in modes and "data" not in modes
    assert "tensor data compared                           0.000 GB" in capsys.readouterr().out


def test_module_dumps_with_tensors_are_judged_on_their_statistics(llama, tokens, tmp_path):
    def run(folder, task, fault=None):
        dbg = xray.PrecisionDebugger(dump_path=folder, model=llama, task=task)
        with torch.no_grad(), fault or torch.autograd.grad_mode.no_grad():
            dbg.start()
            llama(tokens)
            dbg.stop()
        dbg.close()
        return dbg.file

    bench, target = run(tmp_path / "b", "tensor"), run(tmp_path / "t", "tensor", ScaleNthMM(3, 1.001))
    bench0, target0 = run(tmp_path / "b0", "statistics"), run(tmp_path / "t0", "statistics", ScaleNthMM(3, 1.001))
    flagged = compare_dumps(bench, target, statistics_only=True)
    assert _verdict(flagged) == _verdict(compare_dumps(bench0, target0))
    assert "stats" in {r.mode for r in flagged.rows} and "data" not in {r.mode for r in flagged.rows}


@pytest.mark.slow  # a real-size Llama layer recorded four times (~15 s)
def test_the_flag_at_real_size_gives_a_statistics_only_recordings_verdict(tmp_path):
    """Hidden 1024, GQA (16 heads, 4 KV), eager attention, 512 tokens: the shape whose dumps were
    once refused (issue 30); a 1e-3 scaling bug in one matmul."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=512, hidden_size=1024, intermediate_size=2816,
                                         num_hidden_layers=1, num_attention_heads=16, num_key_value_heads=4,
                                         max_position_embeddings=1024, attn_implementation="eager")).eval()
    ids = torch.randint(0, 512, (1, 512), generator=torch.Generator().manual_seed(1))
    dumps = {}
    for saved in (64, 0):
        kw = dict(X_DEBUG=0x102, X_DEDUP=False, X_DUMP_NUM=saved)
        dumps[saved] = (record_forward(model, tmp_path / f"b{saved}", ids, **kw),
                        record_forward(model, tmp_path / f"t{saved}", ids, fault=ScaleNthMM(4, 1.001), **kw))
    flagged = compare_dumps(*dumps[64], statistics_only=True)
    recorded = compare_dumps(*dumps[0])
    assert _verdict(flagged) == _verdict(recorded)
    assert flagged.summary.first_divergence["origin"] == "born"
    assert flagged.summary.bytes_compared == 0 < compare_dumps(*dumps[64]).summary.bytes_compared
