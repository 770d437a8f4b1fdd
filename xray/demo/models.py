"""Real models built from small configs with random weights (nothing is downloaded).

Shared by the demo, the tests and the benchmarks so that they all exercise the same models.
"""
from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Iterator

import torch

# Loggers that speak while transformers imports its optional torchao integration: torchao's
# prebuilt kernels for other Python versions and CUDA ("Failed to load ... .so") and torch's
# note about torchao registering enums. Neither concerns these CPU demo models.
_IMPORT_NOISE = ("torchao", "torch.utils._pytree")


@contextmanager
def _quiet_import() -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in _IMPORT_NOISE]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def tiny_llama(layers: int = 2, hidden: int = 64, heads: int = 4, kv_heads: int = 2, vocab: int = 256,
               intermediate: int | None = None, seed: int = 0, attn: str = "eager") -> torch.nn.Module:
    """A transformers LlamaForCausalLM with random weights, in eval mode.

    ``attn="eager"`` (the default here) spells attention out as matmul/softmax ops, which every
    replay backend can express; ``"sdpa"`` is transformers' own default."""
    with _quiet_import():
        from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate or hidden * 2 + hidden // 2,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                      max_position_embeddings=512, attn_implementation=attn)
    return LlamaForCausalLM(cfg).eval()


def bench_llama(seed: int = 0, hidden: int = 256) -> torch.nn.Module:
    """The benchmark model named by the issues: 4 layers, hidden 256 (run on 2x128 tokens).
    Other widths keep its proportions (64-wide heads, two query heads per KV head, MLP 2.6875x)."""
    return tiny_llama(layers=4, hidden=hidden, heads=hidden // 64, kv_heads=hidden // 128, vocab=1000,
                      intermediate=hidden * 688 // 256, seed=seed, attn="sdpa")


def token_batch(batch: int = 2, seq: int = 16, vocab: int = 256, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, seq), generator=g)


def tiny_vit(seed: int = 0) -> torch.nn.Module:
    """A transformers ViTForImageClassification (LayerNorm, GELU, conv patch embedding)."""
    with _quiet_import():
        from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(seed)
    cfg = ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=64, num_hidden_layers=2,
                    num_attention_heads=4, intermediate_size=128, num_labels=10)
    return ViTForImageClassification(cfg).eval()
