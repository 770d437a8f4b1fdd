"""Real models at real sizes (issue 30): tiny configs hid a validator that could not open any dump
of a Llama at 4x512 tokens. Each model here is a transformers config with random weights, one
layer at a real width and sequence length; its statistics-only recording of every call must open
with nothing refused, compare against itself with no FAIL row and no first divergence, and
generate an op suite.

Select with ``-m real_size``; the corpus runs in under 3 minutes on the 2-core reference machine.
"""
from __future__ import annotations

import warnings

import pytest
import torch

import xray
from xray.compare import compare_dumps
from xray.dump import RefusedRecordsWarning
from xray.gen.generator import generate

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.real_size

TOKENS = 512


def _llama(attn: str, hidden: int, kv_heads: int, batch: int, tokens: int):
    cfg = transformers.LlamaConfig(hidden_size=hidden, intermediate_size=hidden * 11 // 4, num_hidden_layers=1,
                                   num_attention_heads=16, num_key_value_heads=kv_heads, vocab_size=2048,
                                   max_position_embeddings=tokens, attn_implementation=attn)
    return transformers.LlamaForCausalLM(cfg), _ids(cfg.vocab_size, batch, tokens)


def _mixtral():
    cfg = transformers.MixtralConfig(hidden_size=1024, intermediate_size=1024, num_hidden_layers=1,
                                     num_attention_heads=16, num_key_value_heads=8, vocab_size=2048,
                                     num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=TOKENS,
                                     attn_implementation="sdpa")
    return transformers.MixtralForCausalLM(cfg), _ids(cfg.vocab_size)


def _qwen2_moe():
    cfg = transformers.Qwen2MoeConfig(hidden_size=1024, intermediate_size=1024, moe_intermediate_size=512,
                                      shared_expert_intermediate_size=1024, num_hidden_layers=1,
                                      num_attention_heads=16, num_key_value_heads=4, vocab_size=2048, num_experts=8,
                                      num_experts_per_tok=2, max_position_embeddings=TOKENS, attn_implementation="eager")
    return transformers.Qwen2MoeForCausalLM(cfg), _ids(cfg.vocab_size)


def _bert():
    cfg = transformers.BertConfig(hidden_size=1024, intermediate_size=4096, num_hidden_layers=1,
                                  num_attention_heads=16, vocab_size=2048, max_position_embeddings=TOKENS)
    return transformers.BertModel(cfg), _ids(cfg.vocab_size)


def _convnext():
    cfg = transformers.ConvNextConfig(depths=[1, 1, 1, 1], hidden_sizes=[96, 192, 384, 768], num_labels=10)
    return transformers.ConvNextForImageClassification(cfg), {"pixel_values": torch.randn(1, 3, 224, 224)}


def _resnet():
    cfg = transformers.ResNetConfig(depths=[1, 1, 1, 1], hidden_sizes=[64, 128, 256, 512], layer_type="basic",
                                    num_labels=10)
    return transformers.ResNetForImageClassification(cfg), {"pixel_values": torch.randn(1, 3, 224, 224)}


def _ids(vocab: int, batch: int = 1, tokens: int = TOKENS) -> dict:
    return {"input_ids": torch.randint(0, vocab, (batch, tokens))}


MODELS = {
    # the case: eager attention's (4, 16, 512, 512) scores and repeat_kv's strides
    "llama-h1024-gqa-eager-4x512": lambda: _llama("eager", 1024, 8, 4, 512),
    "llama-h2048-gqa-sdpa-1x1024": lambda: _llama("sdpa", 2048, 4, 1, 1024),
    "mixtral-h1024-moe": _mixtral,
    "qwen2-moe-h1024-eager": _qwen2_moe,
    "bert-h1024": _bert,
    "resnet-224": _resnet,
    "convnext-224": _convnext,
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n.startswith("llama") else n for n in MODELS])
def test_real_size_dump_opens_compares_and_generates(name, tmp_path):
    torch.manual_seed(0)
    model, inputs = MODELS[name]()
    model.eval()
    with torch.no_grad(), xray.dump(dump_dir=tmp_path / "dump", X_DEDUP=False, X_DUMP_NUM=0) as d:
        model(**inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RefusedRecordsWarning)
        dump = xray.load_dump(d.folder)
    assert dump.refused == [] and len(dump.records) == dump.summary["records"] > 20
    widest = max(m.numel for r in dump.records for _, m in r.output_tensors())
    assert widest >= TOKENS * 1024 or name.endswith("-224")

    result = compare_dumps(d.folder, d.folder, progress=False)
    counts = result.status_counts()
    assert "fail" not in counts and result.summary.first_divergence is None, counts
    assert counts.get("pass", 0) > 0

    report = generate(dump, tmp_path / "suite")
    assert report.files > 5 and report.tests >= report.files, report
    assert any((tmp_path / "suite").glob("test_*.py"))
    dump.close()
