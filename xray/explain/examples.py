"""FACTORY functions for ``xray explain`` and ``xray fix`` (docs/explain.md, tests, benchmark).

Each returns ``(model, example_args[, example_kwargs])`` like ``xray drift``'s MODEL specs.
"""
from __future__ import annotations

import torch

from ..demo.models import _quiet_import, tiny_llama, token_batch


def demo_llama():
    """The demo's 2-layer Llama (hidden 64) on 2x16 tokens; pair it with ``--inject`` for the
    demo's broken matmul (``xray explain ... --inject aten.mm.default#5+0.05``)."""
    return tiny_llama(layers=2, hidden=64), (token_batch(batch=2, seq=16),)


# The FF layer that carries the outliers, and by how much its output weights are scaled.
OUTLIER_FF = "encoder.block.1.layer.1.DenseReluDense.wo"
OUTLIER_SCALE = 1e5


def t5_fp16_overflow(d_model: int = 128, seq: int = 32, seed: int = 0):
    """A transformers T5 (2+2 layers, random weights) whose one FF layer has outlier output
    weights, so its activations pass fp16's 65504 as trained T5 checkpoints' do (the reason
    transformers clamps T5 hidden states in fp16). fp32 runs fine; fp16 autocast turns that
    layer's output into Inf and the logits into NaN."""
    with _quiet_import():
        from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(seed)
    cfg = T5Config(vocab_size=256, d_model=d_model, d_kv=d_model // 4, d_ff=4 * d_model, num_layers=2,
                   num_decoder_layers=2, num_heads=4, dropout_rate=0.0)
    model = T5ForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        model.get_submodule(OUTLIER_FF).weight.mul_(OUTLIER_SCALE)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 256, (2, seq), generator=g)
    decoder_ids = torch.randint(0, 256, (2, seq // 2), generator=g)
    return model, (), {"input_ids": ids, "decoder_input_ids": decoder_ids}


def real_llama():
    """A real-size case (hidden 1024, 512 tokens, SDPA attention, one layer to fit the CPU
    budget); call 5 of aten.mm is again the MLP's up_proj, as in the demo."""
    from ..demo.models import tiny_llama as llama

    model = llama(layers=1, hidden=1024, heads=16, kv_heads=8, vocab=1000, intermediate=2752, attn="sdpa")
    return model, (token_batch(batch=1, seq=512, vocab=1000),)
