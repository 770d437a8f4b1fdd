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


def onnx_weight_fault(name: str, index: tuple[int, ...] = (3, 5), delta: float = 0.5):
    """An ``edit`` for onnxrt presets: the deployed ONNX graph holds parameter ``name`` with one
    element off by ``delta`` (a wrong weight shipped with the model)."""

    def edit(proto):
        import numpy as np
        from onnx import numpy_helper

        init = next((i for i in proto.graph.initializer if i.name == name), None)
        if init is None:
            raise KeyError(f"the ONNX graph has no initializer {name!r}")
        a = numpy_helper.to_array(init).copy()
        a[index] += np.asarray(delta, dtype=a.dtype)
        init.CopyFrom(numpy_helper.from_array(a, init.name))

    return edit
