"""Model functions for ``xray drift`` examples, tests and the benchmark (``MODEL`` specs)."""
from __future__ import annotations

import torch


def tiny_llama(layers: int = 2, hidden: int = 64, seq: int = 16) -> tuple[torch.nn.Module, tuple]:
    """The demo's transformers Llama (random weights) and one token batch.

    ``use_cache`` is switched off in the config: a KV cache object is not a tensor output
    torch.export can return, and a drift run is one forward anyway."""
    from ..demo.models import tiny_llama as build, token_batch

    model = build(layers=layers, hidden=hidden)
    model.config.use_cache = False
    return model, (token_batch(batch=2, seq=seq, vocab=model.config.vocab_size),)


def tiny_llama_1layer() -> tuple[torch.nn.Module, tuple]:
    """A 1-layer, 32-wide version for fast tests."""
    return tiny_llama(layers=1, hidden=32, seq=8)
