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


# -- where an fp16 overflow is born: three small models for ``xray fix`` (docs/explain.md) --------

WIDTH = 64


class _Scaled(torch.nn.Module):
    """``big``'s output times a constant in the module's own code, then a norm and a head: under
    fp16 the product overflows between two submodules, where no graft can reach."""

    def __init__(self, factor: float = 300.0) -> None:
        super().__init__()
        self.inp, self.big = torch.nn.Linear(WIDTH, WIDTH), torch.nn.Linear(WIDTH, WIDTH)
        self.norm, self.head = torch.nn.LayerNorm(WIDTH), torch.nn.Linear(WIDTH, 16)
        self.factor = factor

    def forward(self, x):
        h = self.big(self.inp(x)) * self.factor
        return self.head(self.norm(h))


class _Upcast(torch.nn.Module):
    """Computes in float32 (``x.float() * scale``), as a residual stream kept in fp32 does."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.full((WIDTH,), scale))

    def forward(self, x):
        return x.float() * self.scale


class _Chain(torch.nn.Module):
    """inp -> up -> down -> head, each a submodule (the overflow is inside one of them)."""

    def __init__(self, up: torch.nn.Module) -> None:
        super().__init__()
        self.inp, self.up = torch.nn.Linear(WIDTH, WIDTH), up
        self.down, self.head = torch.nn.Linear(WIDTH, WIDTH), torch.nn.Linear(WIDTH, 16)

    def forward(self, x):
        return self.head(self.down(self.up(self.inp(x))))


def _built(model: torch.nn.Module, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return model.eval(), (torch.randn(4, WIDTH, generator=g),)


def overflow_in_parent_code():
    """``h = self.big(h) * 300.0`` in the model's own forward: ``big`` peaks at about 300, the
    product at 9e4 > fp16's 65504. Every graft is Inf; ``big`` kept in fp32 hands the product an
    fp32 input, and that fixes it."""
    torch.manual_seed(0)
    model = _Scaled()
    with torch.no_grad():
        model.big.weight.mul_(300.0)
    return _built(model)


def overflow_between_modules():
    """``up`` computes in float32 and hands ``down`` values up to 5e5: ``down``'s autocast casts
    them to fp16, Inf. ``down`` kept in fp32 takes them as they are."""
    torch.manual_seed(0)
    model = _Chain(_Upcast(1e6))
    with torch.no_grad():
        model.down.weight.mul_(1e-4)
    return _built(model)


def overflow_inside_module():
    """``up`` is a LayerNorm whose weights (1e5) make its own fp16 output overflow; kept in fp32
    its output stays fp32 and overflows again where ``down`` casts it: both are needed."""
    torch.manual_seed(0)
    model = _Chain(torch.nn.LayerNorm(WIDTH))
    with torch.no_grad():
        model.up.weight.mul_(1e5)
        model.down.weight.mul_(1e-4)
    return _built(model)


def deep_llama(layers: int = 32, hidden: int = 256):
    """A deep decoder for ``--search tree`` (32 layers, hidden 256, 1 x 8 tokens): about 420
    modules, some 2,000 forwards measured one by one. Call 20 * 7 + 5 of aten.mm is layer 20's
    up_proj (q, k, v, o, gate, up, down per layer): ``--inject aten.mm.default#145+0.05``."""
    from ..demo.models import tiny_llama as llama

    return llama(layers=layers, hidden=hidden, heads=4, kv_heads=2), (token_batch(batch=1, seq=8),)


def module_fault(model: torch.nn.Module, name: str, offset: float = 0.05):
    """A ``target_context`` adding ``offset`` to submodule ``name``'s output: the demo's broken
    matmul without a Python dispatch mode over every op (``--inject`` tripled the forward's cost
    on ``deep_llama``). Runs before explain's own hooks (prepend), so a graft replaces it."""
    import contextlib

    @contextlib.contextmanager
    def context():
        handle = model.get_submodule(name).register_forward_hook(lambda m, i, out: out + offset, prepend=True)
        try:
            yield
        finally:
            handle.remove()
    return context
