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


def tiny_vit(seed: int = 0) -> tuple[torch.nn.Module, tuple]:
    """A transformers ViTForImageClassification (random weights, sdpa attention): one 32x32 image,
    8x8 patches (a conv patch embedding), 1 layer, 32 wide, 10 labels."""
    from ..demo.models import _quiet_import

    with _quiet_import():
        from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(seed)
    cfg = ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=1,
                    num_attention_heads=2, intermediate_size=64, num_labels=10, attn_implementation="sdpa")
    model = ViTForImageClassification(cfg).eval()
    return model, (torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(seed)),)


def tiny_whisper_encoder(seed: int = 0) -> tuple[torch.nn.Module, tuple]:
    """An audio encoder: transformers WhisperForAudioClassification (random weights, sdpa) on one
    log-mel clip of 16 bins x 32 frames: Whisper's two conv1d layers (the second of stride 2, so
    32 frames -> ``max_source_positions`` 16), sinusoidal positions, 1 encoder layer 32 wide, mean
    pooling and a 4-way classifier. No decoder: it classifies from the encoder alone.

    The first choice of the brief (Whisper encoder, then Wav2Vec2, then T5) exported and lowered on
    the first try: torch.export (strict=False), ONNX Runtime, ExecuTorch XNNPACK and portable, and
    inductor all run it (transformers 5, torch 2.13, executorch 1.5.1); the others were not needed."""
    from ..demo.models import _quiet_import

    with _quiet_import():
        from transformers import WhisperConfig, WhisperForAudioClassification

    torch.manual_seed(seed)
    cfg = WhisperConfig(num_mel_bins=16, d_model=32, encoder_layers=1, encoder_attention_heads=2,
                        encoder_ffn_dim=64, decoder_layers=1, decoder_attention_heads=2, decoder_ffn_dim=64,
                        max_source_positions=16, vocab_size=64, num_labels=4, attn_implementation="sdpa")
    model = WhisperForAudioClassification(cfg).eval()
    return model, (torch.randn(1, 16, 32, generator=torch.Generator().manual_seed(seed)),)


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


def executorch_weight_fault(name: str, index: tuple[int, ...] = (3, 5), delta: float = 0.5):
    """An ``edit`` for ExecuTorch presets: the edge program holds parameter ``name`` with one element
    off by ``delta`` before ``to_executorch`` serialises it (a wrong weight shipped in the .pte).

    The edge program's weights are its own copies by then (``executorch_debug._own_weights``), so
    the in-place change never reaches the reference. Under XNNPACK a delegated Linear's weight is
    already inside the delegate blob and is not in the edge state dict: use the portable preset."""

    def edit(edge):
        state = edge.exported_program().state_dict
        if name not in state:
            raise KeyError(f"the ExecuTorch edge program has no parameter {name!r} (delegated weights live "
                           f"inside the delegate blob)")
        with torch.no_grad():
            state[name][index] += delta

    return edit
