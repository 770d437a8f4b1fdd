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


# --- quantized runs (``quant=int8``): small models and injected quantization bugs -----------

class _MLP(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(d, 2 * d), torch.nn.Linear(2 * d, 2 * d)
        self.fc3, self.head = torch.nn.Linear(2 * d, d), torch.nn.Linear(d, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))))


def tiny_mlp(hidden: int = 64, batch: int = 16, seed: int = 0) -> tuple[torch.nn.Module, tuple]:
    """Four Linear layers with ReLUs (hidden -> 2 hidden -> 2 hidden -> hidden -> 10), random weights."""
    torch.manual_seed(seed)
    return _MLP(hidden).eval(), (torch.randn(batch, hidden, generator=torch.Generator().manual_seed(seed)),)


class _CNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.Conv2d(16, 32, 3, padding=1)
        self.head = torch.nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        return self.head(torch.nn.functional.adaptive_avg_pool2d(y, 1).flatten(1))


def tiny_cnn(seed: int = 0) -> tuple[torch.nn.Module, tuple]:
    """Two 3x3 convolutions with ReLUs, average pool, a Linear head; two 3x16x16 images."""
    torch.manual_seed(seed)
    return _CNN().eval(), (torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(seed)),)


def tiny_bert(hidden: int = 64, layers: int = 2, seq: int = 16, seed: int = 0) -> tuple[torch.nn.Module, tuple]:
    """transformers BertModel (encoder) from a config, random weights, eager attention, 2 x ``seq`` tokens."""
    from ..demo.models import _quiet_import

    with _quiet_import():
        from transformers import BertConfig, BertModel
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=128, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                     intermediate_size=4 * hidden, max_position_embeddings=max(64, seq), attn_implementation="eager")
    model = BertModel(cfg, add_pooling_layer=False).eval()
    ids = torch.randint(0, 128, (2, seq), generator=torch.Generator().manual_seed(seed))
    return model, (ids,)


def _layer_of_onnx_node(node) -> str:
    import ast

    scopes = next((p.value for p in node.metadata_props if p.key == "pkg.torch.onnx.name_scopes"), "[]")
    parts = [s for s in ast.literal_eval(scopes) if s]  # ['encoder', 'encoder.layer.0', ..., 'addmm']
    return parts[-2] if len(parts) >= 2 else ""


def onnx_weight_scale_fault(layer: str, factor: float = 1.5):
    """An ``edit`` for ``onnxrt-cpu:quant=...``: ``layer``'s quantized weight reads scales ``factor``
    times too large (a wrong weight scale shipped after quantization), whatever the scheme
    (``onnx_weight_scales_of``)."""

    def edit(proto):
        import numpy as np
        from onnx import numpy_helper

        scales = onnx_weight_scales_of(proto, layer)
        if not scales:
            raise KeyError(f"no quantized weight of layer {layer!r} in the ONNX graph")
        for scale in scales:
            a = numpy_helper.to_array(scale) * np.asarray(factor, dtype=np.float32)
            scale.CopyFrom(numpy_helper.from_array(a.astype(np.float32), scale.name))

    return edit


def onnx_weight_scales_of(proto, layer: str) -> list:
    """The scale initializers of ``layer``'s quantized weights: a static QDQ graph's weight (and
    int32 bias) DequantizeLinear scales, a dynamic MatMulInteger's weight scale (the float
    initializer its scale Mul reads), a MatMulNBits's block scales."""
    inits = {i.name: i for i in proto.graph.initializer}
    found = [inits[dq.input[1]] for dq, _ in onnx_dequantizers_of(proto, layer)]
    for n in proto.graph.node:
        if _layer_of_onnx_node(n) != layer:
            continue
        if n.op_type == "MatMulNBits":
            found.append(inits[n.input[2]])
        elif n.op_type == "Mul" and any(i.endswith("_scale") and i in inits for i in n.input):
            found += [inits[i] for i in n.input if i in inits and inits[i].data_type == 1]
    return found


def onnx_dequantizers_of(proto, layer: str, weight_only: bool = False):
    """(DequantizeLinear node, initializers by name) of each quantized constant ``layer``'s
    Gemm/MatMul/Conv reads (``weight_only``: its weight, not its int32 bias): what a fault edits."""
    g = proto.graph
    inits = {i.name: i for i in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    for n in g.node:
        if n.op_type not in ("Gemm", "MatMul", "Conv") or _layer_of_onnx_node(n) != layer:
            continue
        for name in (n.input[1:2] if weight_only else n.input):
            dq = producer.get(name)
            if dq is not None and dq.op_type == "DequantizeLinear" and dq.input[0] in inits:
                yield dq, inits


def _pt2e_weight_dq(gm, layer: str) -> list:
    """The dequantize_per_channel nodes feeding ``layer``'s linear/conv in a converted PT2E module."""
    found = []
    for n in gm.graph.nodes:
        if "dequantize_per_channel" not in str(n.target):
            continue
        for user in n.users:
            stack = user.meta.get("nn_module_stack") or {}
            path = list(stack.values())[-1][0] if stack else ""
            if path == layer:
                found.append(n)
    if not found:
        raise KeyError(f"no per-channel quantized weight of layer {layer!r} in the PT2E module")
    return found


def pt2e_weight_scale_fault(layer: str, factor: float = 1.5):
    """An ``edit`` for ``executorch-*:quant=int8``: after calibration, ``layer``'s per-channel weight
    scales are ``factor`` times too large in the converted PT2E module."""

    def edit(gm):
        for dq in _pt2e_weight_dq(gm, layer):
            target = dq.args[1].target
            setattr(gm, target, getattr(gm, target) * factor)

    return edit


def pt2e_per_tensor_fault(layer: str):
    """An ``edit`` for ``executorch-*:quant=int8``: ``layer``'s weight requantized per tensor (one
    scale, the largest channel's) where the flow meant per channel."""

    def edit(gm):
        for dq in _pt2e_weight_dq(gm, layer):
            wq, sc, zp = (getattr(gm, a.target) for a in dq.args[:3])
            axis = dq.args[3]
            shape = [1] * wq.dim()
            shape[axis] = -1
            w = (wq.to(torch.float32) - zp.reshape(shape).to(torch.float32)) * sc.reshape(shape)
            step = sc.max()
            setattr(gm, dq.args[0].target, torch.clamp(torch.round(w / step), -127, 127).to(wq.dtype))
            setattr(gm, dq.args[1].target, torch.full_like(sc, float(step)))

    return edit


def dead_unit_outlier(model: torch.nn.Module, layer: str, producer: str, unit: int = 0,
                      factor: float = 50.0) -> torch.nn.Module:
    """One Linear whose int8 weights are ruined while its float output is not: ``producer``'s
    output ``unit`` dies (weights x0.01, bias -1: the ReLU after it gives 0 on every input) and
    ``layer``'s weights reading that unit are set to ``factor`` x the layer's largest. Float
    multiplies the outliers by zeros; per-channel int8 takes every row's step from its outlier,
    and most of the row rounds to 0. Kept in float, the layer is exact again."""
    src, dst = model.get_submodule(producer), model.get_submodule(layer)
    with torch.no_grad():
        src.weight[unit] *= 0.01
        src.bias[unit] = -1.0
        dst.weight[:, unit] = factor * float(dst.weight.abs().max())
    return model


def spread_channels(model: torch.nn.Module, layer: str, factor: float = 30.0, channels: int = 2) -> torch.nn.Module:
    """Scale the first ``channels`` output channels of ``layer``'s weight by ``factor`` (in the float
    model): channel ranges that differ widely, which per-channel int8 handles and per-tensor does not."""
    w = model.get_submodule(layer).weight
    with torch.no_grad():
        w[:channels] *= factor
    return model
