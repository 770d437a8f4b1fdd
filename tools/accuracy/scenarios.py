"""The benchmark's scenarios: every class of issue 17, each several times across architectures.

Calls are picked across the depth of each model (early, middle, late layers) and op kinds
(matmuls, attention, activations, norms, reductions); nothing here is tuned to what compare
finds. Amounts: 1e-3 relative error is a realistic kernel bug well above float32 noise;
with bf16/TF32 noise the bug is 2-5e-2, above that noise level.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from xray.record.config import DumpConfig

from .scenario import Fault, Scenario

MM, ADDMM, BMM = "aten.mm.default", "aten.addmm.default", "aten.bmm.default"


# what the recorder does unless told otherwise: de-dup, and X_DUMP_NUM tensors saved per call
RECORDER_DEFAULTS = {"dedup": DumpConfig.dedup, "dump_num": DumpConfig.dump_num}


def _f(op: str, call: int, kind: str = "rel", amount: float = 1e-3, direction: str = "forward") -> Fault:
    return Fault(op if op.startswith("aten.") else f"aten.{op}", call, kind, amount, direction)


def scenarios() -> list[Scenario]:
    out: list[Scenario] = []

    def add(cls: str, arch: str, **kw) -> None:
        out.append(Scenario(name=f"{cls}/{arch}/{len(out)}", cls=cls, arch=arch, **kw))

    # 1. whole-tensor relative error, saved tensors and statistics only
    for arch, fault in (("llama-sdpa", _f(MM, 4)), ("llama-eager", _f(BMM, 1)), ("qwen2", _f(ADDMM, 2)),
                        ("gpt2", _f(ADDMM, 3)), ("bert", _f(ADDMM, 5)), ("t5", _f(MM, 10)),
                        ("vit", _f(ADDMM, 4)), ("vit", _f("convolution.default", 0)),
                        ("gpt2", _f("_softmax.default", 1)), ("bert", _f("gelu.default", 0)),
                        ("llama-eager", _f("silu.default", 1))):
        add("whole-1e-3", arch, fault=fault)
    for arch, fault in (("llama-sdpa", _f(MM, 8)), ("gpt2", _f(ADDMM, 5)), ("vit", _f(ADDMM, 7)),
                        ("t5", _f(BMM, 3))):
        add("whole-1e-3/stats", arch, fault=fault, data=False)
    # 2. partial corruption: a few elements, one spike, a zeroed column
    for arch, fault in (("llama-sdpa", _f(MM, 6, "few", 1e-2)), ("bert", _f(ADDMM, 7, "few", 1e-2)),
                        ("t5", _f(MM, 20, "few", 1e-2)), ("qwen2", _f(MM, 3, "spike", 8)),
                        ("gpt2", _f("native_layer_norm.default", 2, "spike", 8)),
                        ("vit", _f("gelu.default", 1, "spike", 8)), ("llama-eager", _f(MM, 9, "zero-col", 1)),
                        ("bert", _f(ADDMM, 2, "zero-col", 3)), ("t5", _f(BMM, 5, "zero-col", 2))):
        add("partial", arch, fault=fault)
    # 3. small-magnitude tensors: the variance inside RMSNorm (~1e-3), 1e-3 relative
    for arch, call in (("llama-sdpa", 1), ("llama-eager", 2), ("qwen2", 3), ("t5", 4)):
        add("small-magnitude", arch, fault=_f("mean.dim", call))
    add("small-magnitude/stats", "llama-sdpa", fault=_f("mean.dim", 2), data=False)
    # 4. backward faults (loss.backward() recorded with the BACKWARD bit)
    for arch, fault in (("llama-sdpa", _f(MM, 5)), ("qwen2", _f(MM, 10)), ("gpt2", _f(MM, 4)),
                        ("bert", _f(MM, 6)), ("vit", _f(MM, 8)), ("t5", _f(MM, 20)),
                        ("llama-eager", _f(BMM, 2)), ("gpt2", _f("_softmax_backward_data.default", 0)),
                        # judged through their kernel family's reference (stop 37)
                        ("llama-sdpa", _f("_scaled_dot_product_flash_attention_for_cpu_backward.default", 1)),
                        ("qwen2", _f("_scaled_dot_product_flash_attention_for_cpu_backward.default", 0)),
                        ("resnet", _f("native_batch_norm_backward.default", 2))):
        add("backward", arch, fault=Fault(fault.op, fault.call, "rel", 1e-3, "backward"), backward=True)
    # 5. one changed parameter element: trace dumps, then module dumps
    for arch, param in (("llama-sdpa", "model.layers.1.mlp.down_proj.weight"),
                        ("gpt2", "transformer.h.0.mlp.c_fc.weight"),
                        ("bert", "encoder.layer.1.attention.self.query.weight"),
                        ("vit", "vit.layers.0.mlp.fc2.weight"),
                        ("qwen2", "model.layers.0.input_layernorm.weight"),
                        ("t5", "encoder.block.1.layer.1.DenseReluDense.wo.weight")):
        add("parameter", arch, param=param)
    for arch, param, data in (("llama-sdpa", "model.layers.0.self_attn.v_proj.weight", True),
                              ("gpt2", "transformer.h.1.attn.c_proj.weight", False),
                              ("bert", "encoder.layer.0.intermediate.dense.weight", True),
                              ("vit", "vit.layers.1.attention.k_proj.weight", False)):
        add("parameter/module", arch, param=param, dump="module", data=data)
    # 5b. a norm's eps set wrong on the target (a deployment's config mismatch): the call computes
    # right on its own arguments, so only its argument tells (added at stop 40)
    for arch, attribute, kw in (("llama-sdpa", ("model.layers.1.post_attention_layernorm", "variance_epsilon", 1e-2), {}),
                                ("vit", ("vit.layers.1.layernorm_before", "eps", 1e-2), {}),
                                ("t5", ("encoder.block.1.layer.0.layer_norm", "variance_epsilon", 1e-2), {}),
                                ("gpt2", ("transformer.h.1.ln_2", "eps", 1e-1), {"data": False}),
                                ("qwen2", ("model.layers.0.input_layernorm", "variance_epsilon", 1e-1),
                                 {"noise": "bf16"})):
        add("argument" + ("/stats" if kw.get("data") is False else "") + ("/bf16" if kw.get("noise") else ""), arch,
            attribute=attribute, **kw)
    # 6. module-level dumps (PrecisionDebugger) with an op fault; with dump_torch_api the op
    for arch, fault, data in (("llama-sdpa", _f(MM, 5), True), ("gpt2", _f(ADDMM, 6), False),
                              ("bert", _f("gelu.default", 1), True), ("qwen2", _f(ADDMM, 4), False),
                              ("vit", _f(ADDMM, 2), True)):
        add("module-level", arch, fault=fault, dump="module", data=data)
    for arch, fault in (("llama-sdpa", _f(MM, 10)), ("bert", _f(ADDMM, 9))):
        add("module+aten", arch, fault=fault, dump="module+aten")
    # 7. the error enters through an op only the target runs (a corrupting mul after a module)
    for arch, path in (("llama-sdpa", "model.layers.1.self_attn.o_proj"), ("gpt2", "transformer.h.0.attn.c_attn"),
                       ("bert", "encoder.layer.1.output.dense"), ("vit", "vit.layers.0.mlp.fc1"),
                       ("qwen2", "model.layers.0.mlp.up_proj"), ("t5", "decoder.block.0.layer.0.SelfAttention.q")):
        add("target-only-op", arch, target_only=path)
    # 8. a real bug under legitimate reduced-precision noise
    for arch, fault in (("llama-sdpa", _f(MM, 7, "rel", 2e-2)), ("gpt2", _f(ADDMM, 4, "rel", 2e-2)),
                        ("vit", _f(ADDMM, 9, "rel", 2e-2)), ("llama-eager", _f(BMM, 2, "spike", 8))):
        add("noise+bug/tf32", arch, fault=fault, noise="tf32")
    for arch, fault in (("llama-sdpa", _f(MM, 11, "rel", 5e-2)), ("bert", _f(ADDMM, 8, "rel", 5e-2)),
                        ("qwen2", _f(MM, 5, "rel", 5e-2))):
        add("noise+bug/bf16", arch, fault=fault, noise="bf16")
    # 9. renamed modules (wrapped target), extra and missing harmless ops, plus one bug
    for arch, wrap, fault in (("llama-sdpa", "inner", _f(MM, 3)), ("gpt2", "inner", _f(ADDMM, 2)),
                              ("bert", "module", _f(ADDMM, 4)), ("vit", "module", _f(ADDMM, 10))):
        add("rename/wrapper", arch, fault=fault, wrap=wrap)
    add("extra-op", "llama-sdpa", fault=_f(MM, 12), extra_op="model.layers.0.mlp.gate_proj")
    add("extra-op", "gpt2", fault=_f(ADDMM, 7), extra_op="transformer.h.0.mlp.c_proj")
    add("missing-op", "bert", fault=_f(ADDMM, 10), missing_op="encoder.layer.0.attention.output.dense")
    add("missing-op", "qwen2", fault=_f(MM, 7), missing_op="model.layers.1.self_attn.q_proj")
    # 10. integer results off by one (tolerance 0)
    for arch, call in (("llama-sdpa", 0), ("gpt2", 0), ("t5", 4)):  # position ids; T5's relative positions
        add("integer", arch, fault=_f("arange.default", call, "int", 1))
    # 11. crash class: T5 (finfo.min masks) and runs diverging to ~1e20
    add("t5-finfo-min", "t5", fault=_f(MM, 15))
    add("t5-finfo-min", "t5", fault=_f("_safe_softmax.default", 1), data=False)
    for arch, fault in (("llama-sdpa", _f(MM, 6, "rel", 1e20)), ("gpt2", _f(ADDMM, 3, "rel", 1e20)),
                        ("t5", _f(MM, 8, "rel", 1e20)), ("vit", _f(ADDMM, 5, "rel", 1e20))):
        add("huge-values", arch, fault=fault)
    # noise only: legitimate precision changes, no bug
    for noise, archs in (("bf16", ("llama-sdpa", "gpt2", "bert", "vit")), ("fp16", ("llama-sdpa", "qwen2", "gpt2")),
                         ("tf32", ("llama-eager", "qwen2", "t5", "vit")), ("threads", ("llama-sdpa", "bert", "t5")),
                         ("math-sdpa", ("llama-sdpa", "qwen2", "vit")), ("eager-vs-sdpa", ("llama-eager",))):
        for arch in archs:
            add(f"noise/{noise}", arch, noise=noise)
    add("noise/bf16", "llama-sdpa", noise="bf16", dump="module")
    # a training step's backward under reduced precision: attention and batch-norm gradients are
    # judged through their kernel families' references (stop 37)
    for arch, noise in (("llama-sdpa", "bf16"), ("qwen2", "threads"), ("resnet", "bf16"), ("resnet", "bn-kernel")):
        add(f"noise/{noise}/backward", arch, noise=noise, backward=True)
    add("noise/tf32", "gpt2", noise="tf32", dump="module", data=False)
    # statistics only (the cheap recording a device run usually makes): nothing is recomputed,
    # so noise must be told from a bug by the statistics alone (added at stop 36)
    for noise, archs in (("tf32", ("llama-eager", "qwen2", "gpt2", "vit")), ("bf16", ("llama-sdpa", "bert", "t5")),
                         ("fp16", ("llama-eager", "gpt2", "t5", "bert"))):
        for arch in archs:
            add(f"noise/{noise}/stats", arch, noise=noise, data=False)
    for arch, fault in (("qwen2", _f(MM, 5, "rel", 2e-2)), ("gpt2", _f(ADDMM, 6, "rel", 2e-2)),
                        ("t5", _f(MM, 12, "rel", 2e-2)), ("llama-eager", _f(MM, 10, "rel", 2e-2))):
        add("noise+bug/tf32/stats", arch, fault=fault, noise="tf32", data=False)
    # another device's kernel for the same batch norm (cudnn_batch_norm on CUDA; here the
    # exported-program kernel, a real CPU op of another name): clean, and with a bug in it or
    # beside it (added at stop 37; the CNNs of held-out sets 1, 3 and 4)
    BN = "aten._native_batch_norm_legit_no_training.default"
    for arch, kw in (("resnet", {}), ("mobilenet", {}), ("efficientnet", {}), ("mobilenet", {"data": False}),
                     ("efficientnet", {"dump": "module", "data": False})):
        add("noise/bn-kernel" + ("/stats" if kw.get("data") is False else ""), arch, noise="bn-kernel", **kw)
    for arch, fault, kw in (("resnet", _f(BN, 2), {}), ("mobilenet", _f(BN, 5), {}),
                            ("efficientnet", _f("convolution.default", 9), {}),
                            ("efficientnet", _f(BN, 4, "rel", 1e-2), {"data": False})):
        add("bn-kernel+bug" + ("/stats" if kw else ""), arch, fault=fault, noise="bn-kernel", **kw)
    # F.rms_norm as one fused kernel on the target (CUDA's _fused_rms_norm; here a CPU kernel
    # registered for that op) where the bench runs it as several ops (added at stop 37)
    RMS, RMS_BACKWARD = "aten._fused_rms_norm.default", "aten._fused_rms_norm_backward.default"
    for arch, kw in (("llama-sdpa", {}), ("qwen2", {}), ("llama-eager", {"data": False}),
                     ("llama-sdpa", {"backward": True})):
        add("noise/fused-rms-norm" + ("/stats" if kw.get("data") is False else ""), arch, noise="fused-rms-norm", **kw)
    for arch, fault, kw in (("llama-sdpa", _f(RMS, 2), {}), ("qwen2", _f(RMS, 4), {}),
                            ("llama-eager", _f(RMS, 1, "rel", 1e-2), {"data": False}),
                            ("llama-sdpa", Fault(RMS_BACKWARD, 1, "rel", 1e-3, "backward"), {"backward": True})):
        cls = "fused-rms-norm+bug" + ("/stats" if kw.get("data") is False else "")
        add(cls, arch, fault=fault, noise="fused-rms-norm", **kw)
    # a multi-layer LSTM or GRU as one cuDNN-like kernel on the target (CUDA's _cudnn_rnn, each
    # step's GEMMs in TF32 as cudnn's default allows; here a CPU kernel registered for that op)
    # where the bench runs oneDNN's layers or matmuls per step (added at stop 40)
    RNN, RNN_BACKWARD = "aten._cudnn_rnn.default", "aten._cudnn_rnn_backward.default"
    for arch, kw in (("lstm-lm", {}), ("gru-lm", {}), ("lstm-lm", {"data": False}), ("lstm-lm", {"backward": True}),
                     ("gru-lm", {"backward": True})):
        add("noise/cudnn-rnn" + ("/stats" if kw.get("data") is False else "") + ("/backward" if kw.get("backward") else ""),
            arch, noise="cudnn-rnn", **kw)
    for arch, fault, kw in (("lstm-lm", _f(RNN, 0, "rel", 2e-2), {}), ("gru-lm", _f(ADDMM, 0, "rel", 2e-2), {}),
                            ("gru-lm", _f(RNN, 0, "rel", 5e-2), {"data": False}),
                            ("lstm-lm", Fault(RNN_BACKWARD, 0, "rel", 2e-2, "backward"), {"backward": True})):
        add("cudnn-rnn+bug" + ("/stats" if kw.get("data") is False else ""), arch, fault=fault, noise="cudnn-rnn", **kw)
    # a whole training step: forward, backward and one AdamW step, as per-tensor ops, multi-tensor
    # _foreach_* kernels (accelerators' default) or one fused kernel, the same on both sides; a
    # multi-tensor kernel returns nothing, its written tensors are its outputs (added at stop 38)
    for arch, fault, opt in (("llama-sdpa", _f("_foreach_addcdiv_.ScalarList", 0), "foreach"),
                             ("gpt2", _f("_foreach_lerp_.Scalar", 0), "foreach"),
                             ("qwen2", _f("_foreach_addcmul_.Scalar", 0), "foreach"),
                             ("resnet", _f("_fused_adamw_.default", 0), "fused"),
                             ("t5", _f("addcdiv_.default", 5), "loop"),
                             ("vit", _f("_foreach_addcdiv_.ScalarList", 0), "foreach", ), ):
        add("optimizer-step", arch, fault=fault, optimizer=opt, backward=True)
    add("optimizer-step/stats", "bert", fault=_f("_foreach_addcdiv_.ScalarList", 0), optimizer="foreach",
        backward=True, data=False)
    # (a pure float16 AdamW is no noise case: its eps, 1e-8, is 0 in float16, and its update is Inf
    # where a squared gradient underflows; tests/test_optimizer_step.py checks that this is reported)
    for arch, noise, opt, kw in (("llama-sdpa", "tf32", "foreach", {}), ("gpt2", "bf16", "foreach", {}),
                                 ("resnet", "bf16", "fused", {}),
                                 ("vit", "threads", "foreach", {}), ("t5", "bf16", "loop", {}),
                                 # statistics only: gradients that are 0 in exact arithmetic (BERT's loss on
                                 # LayerNorm outputs; ViT's key bias under softmax) hold only rounding
                                 ("bert", "tf32", "foreach", {"data": False}), ("vit", "tf32", "foreach", {"data": False})):
        cls = f"noise/{noise}/optimizer-step" + ("/stats" if kw else "")
        add(cls, arch, noise=noise, optimizer=opt, backward=True, **kw)
    # a training step's backward recorded with statistics only (added at stop 38, measured, not
    # yet all clean: bf16 and fp16 backward cancellations are open, see docs/compare.md)
    for noise, archs in (("tf32", ("llama-sdpa", "gpt2", "resnet")), ("bf16", ("qwen2", "mobilenet", "t5")),
                         ("fp16", ("llama-eager",))):
        for arch in archs:
            add(f"noise/{noise}/backward/stats", arch, noise=noise, backward=True, data=False)
    for arch, fault in (("llama-sdpa", Fault(MM, 5, "rel", 2e-2, "backward")),
                        ("vit", Fault(MM, 8, "rel", 2e-2, "backward")),
                        ("qwen2", Fault(MM, 10, "rel", 2e-2, "backward"))):
        add("noise+bug/tf32/backward/stats", arch, fault=fault, noise="tf32", backward=True, data=False)
    # bf16 statistics only: the warnings bf16's spread makes are carried loss, so a bug must
    # still stand out (the data classes' 5e-2)
    for arch, fault in (("llama-sdpa", _f(MM, 10, "rel", 5e-2)), ("gpt2", _f(ADDMM, 5, "rel", 5e-2)),
                        ("vit", _f("convolution.default", 0, "rel", 5e-2))):
        add("noise+bug/bf16/stats", arch, fault=fault, noise="bf16", data=False)
    for arch, fault in (("llama-sdpa", Fault(MM, 5, "rel", 5e-2, "backward")),
                        ("qwen2", Fault(MM, 10, "rel", 5e-2, "backward"))):
        add("noise+bug/bf16/backward/stats", arch, fault=fault, noise="bf16", backward=True, data=False)
    # the recorder's default, X_DEDUP=True: a signature's later calls are folded into its first
    # record, so the data edges have gaps (added at stop 39: every TF32 pair failed before)
    for noise, archs in (("tf32", ("llama-sdpa", "bert", "vit", "resnet", "gpt2", "t5")),
                         ("threads", ("qwen2", "vit")), ("bf16", ("llama-sdpa", "t5"))):
        for arch in archs:
            add(f"noise/{noise}/dedup", arch, noise=noise, dedup=True)
    for noise, archs in (("tf32", ("llama-sdpa", "resnet")), ("bf16", ("gpt2", "t5"))):
        for arch in archs:
            add(f"noise/{noise}/backward/dedup", arch, noise=noise, dedup=True, backward=True)
    # the recorder's defaults as a user meets them: de-dup and X_DUMP_NUM=5 (a call with many
    # inputs keeps its outputs' statistics only)
    for noise, archs in (("tf32", ("t5", "vit")), ("bf16", ("llama-sdpa", "resnet"))):
        for arch in archs:
            add(f"noise/{noise}/defaults", arch, noise=noise, **RECORDER_DEFAULTS)
            add(f"noise/{noise}/backward/defaults", arch, noise=noise, **RECORDER_DEFAULTS, backward=True)
    # BERT's loss on LayerNorm outputs: gradients 0 in exact arithmetic, carried through folded calls
    add("noise/bf16/backward/defaults", "bert", noise="bf16", **RECORDER_DEFAULTS, backward=True)
    for arch, fault in (("gpt2", _f(ADDMM, 0)), ("resnet", _f("convolution.default", 4)), ("llama-sdpa", _f(MM, 3))):
        add("bug/defaults", arch, fault=fault, **RECORDER_DEFAULTS)
    # statistics only: a signature's one recorded call makes no band of calls, so the TF32 level
    # comes from the header (declared here, as a device's header says)
    for arch in ("llama-sdpa", "vit"):
        add("noise/tf32/dedup/stats", arch, noise="tf32", dedup=True, data=False)
    # TF32 that the header does not record (a vendor switch, NVIDIA_TF32_OVERRIDE set outside):
    # told only by what the run shows, a band of calls on data, or nothing in a lone statistic
    for arch, kw in (("llama-eager", {}), ("vit", {}), ("qwen2", {"data": False}), ("gpt2", {"data": False}),
                     ("vit", {"dedup": True, "data": False})):
        add("noise/tf32/undeclared" + ("/stats" if kw.get("data") is False else ""), arch, noise="tf32",
            tf32_declared=False, **kw)
    # a bug in a folded call (no record of it: found where a recorded call carries it on) and in a
    # recorded one
    for arch, fault in (("llama-sdpa", _f(MM, 3)), ("gpt2", _f(ADDMM, 6)), ("bert", _f(ADDMM, 8)),
                        ("resnet", _f("convolution.default", 4)), ("llama-sdpa", _f(MM, 0)), ("t5", _f(MM, 1))):
        add("bug/dedup", arch, fault=fault, dedup=True)
    for arch, fault in (("llama-sdpa", _f(MM, 3, "rel", 2e-2)), ("vit", _f(ADDMM, 4, "rel", 2e-2)),
                        ("resnet", _f("convolution.default", 4, "rel", 2e-2)), ("bert", _f(ADDMM, 0, "rel", 2e-2))):
        add("noise+bug/tf32/dedup", arch, fault=fault, noise="tf32", dedup=True)
    return out


@dataclass(frozen=True)
class HeldOut:
    """A decoder LLM and a CNN the rules were not written on, with the names its scenarios need."""

    llm: str
    cnn: str
    llm_param: str
    cnn_param: str
    llm_insert: str  # module path where the target runs one extra, corrupting op
    cnn_insert: str
    cnn_mm: str = ADDMM  # the CNN head's matmul op
    llm_mm: str = MM  # the LLM's projections' op (addmm where they have biases)
    llm_norm: str = "mean.dim"  # a reduction inside its norms
    llm_small: tuple[str, int] = ("mean.dim", 3)  # a call whose output is ~1e-3 in magnitude
    cnn_op: str = "convolution.default"  # the vision model's workhorse op, faulted at several depths
    cnn_backward: str = "aten.convolution_backward.default"
    cnn_late: int = 30  # a late call of cnn_op


HELD_OUT = {
    # set 1: used once to find two defects (integer outputs, calls counted by output), then fixed
    1: HeldOut("mistral", "resnet", "model.layers.1.self_attn.k_proj.weight",
               "resnet.encoder.stages.1.layers.0.layer.0.convolution.weight", "model.layers.0.mlp.down_proj",
               "resnet.encoder.stages.0.layers.0.layer.1.convolution"),
    # set 2: run after those fixes, never used to change a rule
    2: HeldOut("gemma", "convnext", "model.layers.0.mlp.up_proj.weight",
               "convnext.encoder.stages.1.layers.0.dwconv.weight", "model.layers.1.self_attn.o_proj",
               "convnext.encoder.stages.0.layers.0.pwconv1"),
    # set 3: a mixture of experts (top-k routing, grouped matmuls, a 3-D expert weight) and a
    # depthwise CNN with batch norm and ReLU6; added at stop 36, never used to change a rule
    3: HeldOut("mixtral", "mobilenet", "model.layers.0.mlp.experts.down_proj",
               "mobilenet_v2.layer.1.conv_3x3.convolution.weight", "model.layers.0.mlp.experts",
               "mobilenet_v2.layer.0.expand_1x1.convolution"),
    # set 4: partial rotary, parallel attention and MLP, biased projections, LayerNorm and tanh-GELU;
    # squeeze-excitation, SiLU, depthwise convolutions with explicit padding; added at stop 37
    4: HeldOut("phi", "efficientnet", "model.layers.1.self_attn.v_proj.weight",
               "efficientnet.encoder.blocks.2.depthwise_conv.depthwise_conv.weight", "model.layers.0.mlp.fc2",
               "efficientnet.encoder.blocks.1.squeeze_excite.reduce", llm_mm=ADDMM,
               llm_norm="native_layer_norm.default", llm_small=(ADDMM, 3)),  # layer 0 attention's dense output
    # set 5: an encoder-decoder over 1-D convolutions of audio features, cross-attention, biased
    # and unbiased projections; shifted windows (roll, masked_fill, a relative position bias read
    # by index), patch merging; its one convolution is the stem, so its faults go to its linears.
    # Added at stop 37, never used to change a rule
    5: HeldOut("whisper", "swin", "model.encoder.layers.1.self_attn.v_proj.weight",
               "swin.encoder.layers.1.blocks.0.attention.q_proj.weight", "model.decoder.layers.0.fc2",
               "swin.encoder.layers.0.blocks.1.mlp.fc1", llm_mm=ADDMM, llm_norm="native_layer_norm.default",
               llm_small=(ADDMM, 12), cnn_op="addmm.default", cnn_backward=MM, cnn_late=20),
    # set 6: ALiBi added through baddbmm, a fused QKV projection, tanh-GELU; grouped convolutions,
    # squeeze-excitation and batch norm. Added at stop 37 after set 5's fix, never used to change a rule
    6: HeldOut("bloom", "regnet", "transformer.h.1.self_attention.query_key_value.weight",
               "regnet.encoder.stages.1.layers.0.layer.1.convolution.weight", "transformer.h.0.mlp.dense_4h_to_h",
               "regnet.encoder.stages.0.layers.0.layer.0.convolution", llm_mm=ADDMM,
               llm_norm="native_layer_norm.default", llm_small=(ADDMM, 1), cnn_late=15),
    # set 7: disentangled relative attention (gathers over position buckets, a padding mask);
    # overlapping patch convolutions, attention over a sequence reduced by a strided convolution,
    # depthwise convolutions in the MLP. Added at stop 37, never used to change a rule
    7: HeldOut("deberta", "segformer", "encoder.layer.1.attention.self.key_proj.weight",
               "segformer.stages.1.blocks.0.mlp.dwconv.dwconv.weight", "encoder.layer.0.intermediate.dense",
               "segformer.stages.0.blocks.0.mlp.fc1", llm_mm=ADDMM, llm_norm="native_layer_norm.default",
               llm_small=(ADDMM, 3), cnn_late=7),
    # set 8: whole training steps (backward, AdamW as _foreach_* kernels, statistics-only runs)
    # on a decoder with biased projections and a weight-standardized group-norm CNN. Added at
    # stop 38 after the training-step rules, never used to change a rule
    8: HeldOut("opt", "bit", "model.decoder.layers.1.self_attn.k_proj.weight",
               "bit.encoder.stages.1.layers.0.conv2.weight", "model.decoder.layers.0.fc2",
               "bit.encoder.stages.0.layers.0.conv1", llm_mm=ADDMM, llm_norm="native_layer_norm.default",
               llm_small=(ADDMM, 3), cnn_late=7),
    # set 9: a state-space model (selective scan as per-step matmuls, a causal depthwise conv1d, no
    # attention) and a conv net with transformer blocks over unfolded patches. Added at stop 40,
    # after the RNN family, its first run the measurement
    9: HeldOut("mamba", "mobilevit", "backbone.layers.1.mixer.in_proj.weight",
               "mobilevit.encoder.layer.1.layer.0.conv_3x3.convolution.weight", "backbone.layers.0.mixer.out_proj",
               "mobilevit.encoder.layer.0.layer.0.expand_1x1.convolution"),
    # set 10: multi-query attention, attention and MLP in parallel, bias-free projections; raw
    # audio through strided 1-D convolutions with group norm and a weight-normed positional
    # convolution (its 4th and last), then a transformer encoder. Added at stop 41, its first run
    # the measurement
    10: HeldOut("falcon", "wav2vec2", "transformer.h.1.self_attention.query_key_value.weight",
                "wav2vec2.feature_extractor.conv_layers.1.conv.weight", "transformer.h.0.mlp.dense_4h_to_h",
                "wav2vec2.feature_extractor.conv_layers.1.conv", llm_norm="native_layer_norm.default",
                llm_small=(MM, 1), cnn_late=3),  # the attention's dense output, ~5e-3
    # set 11: logit soft-capping, alternating sliding-window and global attention, four norms per
    # layer; a 4-convolution stem, then linear layers with batch norm, Hardswish and attention
    # biases read by index. Added at stop 41, its first run the measurement
    11: HeldOut("gemma2", "levit", "model.layers.1.self_attn.k_proj.weight",
                "levit.patch_embeddings.embedding_layer_3.convolution.weight", "model.layers.0.mlp.down_proj",
                "levit.patch_embeddings.embedding_layer_2.convolution", llm_small=("mean.dim", 9), cnn_late=3),
    # set 12: RMS norms on the query and key projections (QK-norm), norms after attention and MLP
    # (a changed QK-norm weight, an op inserted after it); ConvNeXt V2's global response
    # normalization (its zero-initialised weight changed, an op inserted after it). Added at stop
    # 42 after module-scoped de-dup, its first run the measurement
    12: HeldOut("olmo2", "convnextv2", "model.layers.1.self_attn.k_norm.weight",
                "convnextv2.encoder.stages.1.layers.0.grn.weight", "model.layers.0.self_attn.q_norm",
                "convnextv2.encoder.stages.1.layers.0.grn", llm_small=(MM, 3), cnn_late=5),  # layer 0's o_proj, ~2e-4
}


def holdout(which: int = 1) -> list[Scenario]:
    """Scenarios on architectures the rules never saw while they were written, with the same
    amounts as the main set: the benchmark's check against rules tuned to their own cases."""
    h = HELD_OUT[which]
    out: list[Scenario] = []

    def add(cls: str, arch: str, **kw) -> None:
        out.append(Scenario(name=f"holdout{which}/{cls}/{arch}/{len(out)}", cls=f"holdout {cls}", arch=arch, **kw))

    llm, cnn, conv, mm = h.llm, h.cnn, h.cnn_op, h.llm_mm
    for arch, fault in ((llm, _f(mm, 9)), (llm, _f(h.llm_norm, 1)), (cnn, _f(conv, 3)), (cnn, _f(h.cnn_mm, 0))):
        add("whole-1e-3", arch, fault=fault)
    add("whole-1e-3/stats", cnn, fault=_f(conv, 2), data=False)
    for arch, fault in ((llm, _f(mm, 5, "few", 1e-2)), (cnn, _f(conv, 2, "spike", 8)),
                        (cnn, _f(conv, 1, "zero-col", 1))):
        add("partial", arch, fault=fault)
    add("small-magnitude", llm, fault=_f(*h.llm_small))
    add("backward", llm, fault=Fault(MM, 7, "rel", 1e-3, "backward"), backward=True)
    add("backward", cnn, fault=Fault(h.cnn_backward, 1, "rel", 1e-3, "backward"), backward=True)
    add("parameter", llm, param=h.llm_param)
    add("parameter", cnn, param=h.cnn_param)
    add("module-level", llm, fault=_f(mm, 6), dump="module", data=True)
    add("module-level", cnn, fault=_f(conv, 3), dump="module", data=False)
    add("target-only-op", llm, target_only=h.llm_insert)
    add("target-only-op", cnn, target_only=h.cnn_insert)
    add("noise+bug/tf32", llm, fault=_f(mm, 8, "rel", 2e-2), noise="tf32")
    add("noise+bug/tf32", cnn, fault=_f(conv, 3, "rel", 2e-2), noise="tf32")
    add("noise+bug/bf16", llm, fault=_f(mm, 10, "rel", 5e-2), noise="bf16")
    add("noise+bug/bf16", cnn, fault=_f(conv, 2, "rel", 5e-2), noise="bf16")
    for noise, archs in (("bf16", (llm, cnn)), ("fp16", (llm,)), ("tf32", (llm, cnn)), ("threads", (llm, cnn))):
        for arch in archs:
            add(f"noise/{noise}", arch, noise=noise)
    add("noise/tf32", cnn, noise="tf32", dump="module", data=False)
    if which >= 3:  # statistics-only runs joined the benchmark with set 3 (stop 36)
        for noise, archs in (("tf32", (llm, cnn)), ("bf16", (llm, cnn)), ("fp16", (llm,))):
            for arch in archs:
                add(f"noise/{noise}/stats", arch, noise=noise, data=False)
        add("noise+bug/tf32/stats", llm, fault=_f(mm, 6, "rel", 2e-2), noise="tf32", data=False)
        add("noise+bug/tf32/stats", cnn, fault=_f(conv, h.cnn_late, "rel", 2e-2), noise="tf32", data=False)
    if which >= 8:  # training steps joined the benchmark with set 8 (stop 38)
        for arch in (llm, cnn):
            add("optimizer-step", arch, fault=_f("_foreach_addcdiv_.ScalarList", 0), optimizer="foreach", backward=True)
            add("optimizer-step/stats", arch, fault=_f("_foreach_lerp_.Scalar", 0), optimizer="foreach",
                backward=True, data=False)
            for noise in ("tf32", "bf16"):
                add(f"noise/{noise}/optimizer-step", arch, noise=noise, optimizer="foreach", backward=True)
                add(f"noise/{noise}/optimizer-step/stats", arch, noise=noise, optimizer="foreach", backward=True,
                    data=False)
        add("noise+bug/tf32/backward/stats", llm, fault=Fault(MM, 5, "rel", 2e-2, "backward"), noise="tf32",
            backward=True, data=False)
        add("noise+bug/tf32/backward/stats", cnn, fault=Fault(h.cnn_backward, 2, "rel", 2e-2, "backward"),
            noise="tf32", backward=True, data=False)
    return out


def with_defaults(s: Scenario) -> Scenario:
    """``s`` recorded with the recorder's defaults (RECORDER_DEFAULTS), as users record,
    where it is a trace of legitimate noise or of an injected fault (a changed parameter's or a
    target-only op's ground truth is a call that de-dup may fold); else ``s``."""
    if s.dump != "trace" or not (s.noise_only or s.fault is not None) or s.dedup:
        return s
    return dataclasses.replace(s, name=s.name + "/defaults", cls=s.cls + "/defaults", **RECORDER_DEFAULTS)


def quick(all_: list[Scenario]) -> list[Scenario]:
    """Every other scenario of each class (at least one): the same classes in half the time."""
    seen: dict[str, int] = {}
    keep = []
    for s in all_:
        n = seen.get(s.cls, 0)
        seen[s.cls] = n + 1
        if n % 2 == 0:
            keep.append(s)
    return keep
