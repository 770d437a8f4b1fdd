"""Real transformers architectures with tiny configs and random weights, and their inputs.

Every model is built from a config (nothing is downloaded), in eval mode, float32. Inputs are
short (one sequence of 8 tokens, or one 32x32 image) so a recorded run takes well under a second.
T5 and BERT get a padding mask, so their attention masks hold ``finfo.min``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from xray.demo.models import _quiet_import

VOCAB, SEQ = 128, 8


@dataclass(frozen=True)
class Arch:
    name: str
    build: Callable[[], torch.nn.Module]
    inputs: Callable[[], dict]


def _tokens(seed: int = 0, seq: int = SEQ) -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, seq), generator=torch.Generator().manual_seed(seed))


def _padding_mask(seq: int = SEQ, pad: int = 2) -> torch.Tensor:
    mask = torch.ones(1, seq, dtype=torch.long)
    mask[:, seq - pad:] = 0
    return mask


def _llama(attn: str) -> torch.nn.Module:
    with _quiet_import():
        from transformers import LlamaConfig, LlamaForCausalLM
    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=80, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                        attn_implementation=attn))


def _qwen2() -> torch.nn.Module:
    with _quiet_import():
        from transformers import Qwen2Config, Qwen2ForCausalLM
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=80, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                        attn_implementation="sdpa"))


def _gpt2() -> torch.nn.Module:
    with _quiet_import():
        from transformers import GPT2Config, GPT2LMHeadModel
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=64,
                                      bos_token_id=0, eos_token_id=0, attn_implementation="eager"))


def _bert() -> torch.nn.Module:
    with _quiet_import():
        from transformers import BertConfig, BertModel
    return BertModel(BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=64, max_position_embeddings=64, attn_implementation="sdpa"))


def _t5() -> torch.nn.Module:
    with _quiet_import():
        from transformers import T5Config, T5ForConditionalGeneration
    return T5ForConditionalGeneration(T5Config(vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=64, num_layers=2,
                                               num_decoder_layers=2, num_heads=2, decoder_start_token_id=0))


def _vit() -> torch.nn.Module:
    with _quiet_import():
        from transformers import ViTConfig, ViTForImageClassification
    return ViTForImageClassification(ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=32,
                                               num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                               num_labels=10, attn_implementation="sdpa"))


def _mistral() -> torch.nn.Module:
    with _quiet_import():
        from transformers import MistralConfig, MistralForCausalLM
    return MistralForCausalLM(MistralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=80, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                            max_position_embeddings=64, sliding_window=4, attn_implementation="sdpa"))


def _resnet() -> torch.nn.Module:
    with _quiet_import():
        from transformers import ResNetConfig, ResNetForImageClassification
    return ResNetForImageClassification(ResNetConfig(num_channels=3, embedding_size=16, hidden_sizes=[16, 32],
                                                     depths=[1, 1], layer_type="basic", num_labels=10))


def _gemma() -> torch.nn.Module:
    with _quiet_import():
        from transformers import GemmaConfig, GemmaForCausalLM
    return GemmaForCausalLM(GemmaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=1, head_dim=8,
                                        max_position_embeddings=64, attn_implementation="sdpa"))


def _convnext() -> torch.nn.Module:
    with _quiet_import():
        from transformers import ConvNextConfig, ConvNextForImageClassification
    return ConvNextForImageClassification(ConvNextConfig(num_channels=3, hidden_sizes=[16, 32], depths=[1, 1],
                                                         num_stages=2, num_labels=10, image_size=32, patch_size=4))


def _mixtral() -> torch.nn.Module:
    with _quiet_import():
        from transformers import MixtralConfig, MixtralForCausalLM
    return MixtralForCausalLM(MixtralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                            num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
                                            attn_implementation="sdpa"))


def calibrated(model: torch.nn.Module, seed: int, size: int = 32, batch: int = 8) -> torch.nn.Module:
    """Batch-norm statistics taken from one batch of random ``size`` x ``size`` images, as a
    trained net's hold its activations' statistics; returned in eval mode. With fresh ones (mean
    0, variance 1) and random weights a deep CNN's activations shrink ~10x a layer, to 1e-16 at
    the head, where no fault shows."""
    for m in model.modules():
        if isinstance(m, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d)):  # LeViT normalizes linear layers
            m.reset_running_stats()
            m.momentum = None  # cumulative average: after one batch, that batch's statistics
    model.train()
    with torch.no_grad():
        model(pixel_values=torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(seed)))
    return model.eval()


def _mobilenet() -> torch.nn.Module:
    with _quiet_import():
        from transformers import MobileNetV2Config, MobileNetV2ForImageClassification
    return calibrated(MobileNetV2ForImageClassification(MobileNetV2Config(num_channels=3, image_size=32,
                                                                           depth_multiplier=0.25, num_labels=10)), 7)


def _phi() -> torch.nn.Module:
    with _quiet_import():
        from transformers import PhiConfig, PhiForCausalLM
    return PhiForCausalLM(PhiConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=80, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, partial_rotary_factor=0.5,
                                    max_position_embeddings=64, attn_implementation="sdpa"))


def _efficientnet() -> torch.nn.Module:
    with _quiet_import():
        from transformers import EfficientNetConfig, EfficientNetForImageClassification
    config = EfficientNetConfig(num_channels=3, image_size=32, width_coefficient=0.25, depth_coefficient=0.25,
                                hidden_dim=320, num_labels=10)  # hidden_dim: the head's width at this coefficient
    model = EfficientNetForImageClassification(config)
    # HF draws every convolution's weights, and every batch norm's scale, with std 0.02: each
    # block then shrinks its activations ~100x and they vanish. A trained net's do not: torch's own
    # initialisation scales a convolution by its fan-in and starts a batch norm's scale at 1.
    for m in model.modules():
        if isinstance(m, (torch.nn.Conv2d, torch.nn.BatchNorm2d)):
            m.reset_parameters()
    return calibrated(model, 8)


def _whisper() -> torch.nn.Module:
    with _quiet_import():
        from transformers import WhisperConfig, WhisperForConditionalGeneration
    return WhisperForConditionalGeneration(WhisperConfig(
        vocab_size=VOCAB, num_mel_bins=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64, max_source_positions=16,
        max_target_positions=32, decoder_start_token_id=0, pad_token_id=0, bos_token_id=0, eos_token_id=0,
        attn_implementation="sdpa"))


def _swin() -> torch.nn.Module:
    with _quiet_import():
        from transformers import SwinConfig, SwinForImageClassification
    return SwinForImageClassification(SwinConfig(image_size=32, patch_size=2, num_channels=3, embed_dim=16,
                                                 depths=[2, 2], num_heads=[2, 4], window_size=4, num_labels=10))


def _bloom() -> torch.nn.Module:
    with _quiet_import():
        from transformers import BloomConfig, BloomForCausalLM
    return BloomForCausalLM(BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=3, n_head=4))


def _regnet() -> torch.nn.Module:
    with _quiet_import():
        from transformers import RegNetConfig, RegNetForImageClassification
    return RegNetForImageClassification(RegNetConfig(num_channels=3, embedding_size=16, hidden_sizes=[16, 32],
                                                     depths=[1, 2], groups_width=8, layer_type="y", num_labels=10))


def _deberta() -> torch.nn.Module:
    with _quiet_import():
        from transformers import DebertaV2Config, DebertaV2Model
    return DebertaV2Model(DebertaV2Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
                                          intermediate_size=64, max_position_embeddings=64, relative_attention=True,
                                          position_buckets=8, pos_att_type=["p2c", "c2p"], max_relative_positions=16))


def _segformer() -> torch.nn.Module:
    with _quiet_import():
        from transformers import SegformerConfig, SegformerForImageClassification
    return SegformerForImageClassification(SegformerConfig(
        num_channels=3, num_encoder_blocks=2, depths=[1, 2], sr_ratios=[4, 2], hidden_sizes=[16, 32],
        patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2], num_labels=10,
        image_size=32))


def _opt() -> torch.nn.Module:
    with _quiet_import():
        from transformers import OPTConfig, OPTForCausalLM
    return OPTForCausalLM(OPTConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, ffn_dim=64,
                                    num_attention_heads=2, max_position_embeddings=64, word_embed_proj_dim=32))


def _bit() -> torch.nn.Module:
    with _quiet_import():
        from transformers import BitConfig, BitForImageClassification
    return BitForImageClassification(BitConfig(num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                                               num_groups=4, num_labels=10, layer_type="preactivation"))


def _mamba() -> torch.nn.Module:
    with _quiet_import():
        from transformers import MambaConfig, MambaForCausalLM
    return MambaForCausalLM(MambaConfig(vocab_size=VOCAB, hidden_size=32, state_size=8, num_hidden_layers=3, expand=2,
                                        conv_kernel=4, time_step_rank=4))


def _mobilevit() -> torch.nn.Module:
    with _quiet_import():
        from transformers import MobileViTConfig, MobileViTForImageClassification
    return calibrated(MobileViTForImageClassification(MobileViTConfig(
        image_size=32, patch_size=2, hidden_sizes=[32, 40, 48], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64],
        num_labels=10, num_attention_heads=2, expand_ratio=2.0)), 18)


def _falcon() -> torch.nn.Module:
    with _quiet_import():
        from transformers import FalconConfig, FalconForCausalLM
    return FalconForCausalLM(FalconConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                          num_kv_heads=1, multi_query=True, new_decoder_architecture=False,
                                          parallel_attn=True, bias=False, max_position_embeddings=64,
                                          attn_implementation="sdpa"))


def _wav2vec2() -> torch.nn.Module:
    with _quiet_import():
        from transformers import Wav2Vec2Config, Wav2Vec2ForSequenceClassification
    return Wav2Vec2ForSequenceClassification(Wav2Vec2Config(
        vocab_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        conv_dim=(16, 16, 16), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4, feat_extract_norm="group", num_labels=4, classifier_proj_size=16,
        layerdrop=0.0, mask_time_prob=0.0))


def _gemma2() -> torch.nn.Module:
    with _quiet_import():
        from transformers import Gemma2Config, Gemma2ForCausalLM
    return Gemma2ForCausalLM(Gemma2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=80, num_hidden_layers=3, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=64, sliding_window=4,
        attn_logit_softcapping=50.0, final_logit_softcapping=30.0, attn_implementation="eager"))


def _levit() -> torch.nn.Module:
    with _quiet_import():
        from transformers import LevitConfig, LevitForImageClassification
    model = LevitForImageClassification(LevitConfig(
        image_size=64, num_channels=3, kernel_size=3, stride=2, padding=1, patch_size=16, hidden_sizes=[32, 48, 64],
        num_attention_heads=[2, 3, 4], depths=[1, 1, 1], key_dim=[8, 8, 8], drop_path_rate=0, mlp_ratio=[2, 2, 2],
        attention_ratio=[2, 2, 2], num_labels=10))
    for m in model.modules():  # as EfficientNet's: HF's std-0.02 weights make activations vanish
        if isinstance(m, (torch.nn.Conv2d, torch.nn.BatchNorm2d, torch.nn.BatchNorm1d, torch.nn.Linear)):
            m.reset_parameters()
    return calibrated(model, 22, size=64)


def _olmo2() -> torch.nn.Module:
    with _quiet_import():
        from transformers import Olmo2Config, Olmo2ForCausalLM
    return Olmo2ForCausalLM(Olmo2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=80, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, attn_implementation="sdpa"))


def _convnextv2() -> torch.nn.Module:
    with _quiet_import():
        from transformers import ConvNextV2Config, ConvNextV2ForImageClassification
    return ConvNextV2ForImageClassification(ConvNextV2Config(
        num_channels=3, hidden_sizes=[16, 32, 48], depths=[1, 2, 1], num_stages=3, num_labels=10, image_size=64,
        patch_size=4))


class _RecurrentLM(torch.nn.Module):
    """PyTorch's word-language-model example: an embedding, a 2-layer LSTM or GRU, a decoder.
    transformers has no recurrent language model; this is the one RNN bring-ups run."""

    def __init__(self, cell: str) -> None:
        super().__init__()
        self.encoder = torch.nn.Embedding(VOCAB, 32)
        self.rnn = getattr(torch.nn, cell)(32, 48, num_layers=2, batch_first=True)
        self.decoder = torch.nn.Linear(48, VOCAB)

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor]:
        return (self.decoder(self.rnn(self.encoder(input_ids))[0]),)


def _seeded(make: Callable[[], torch.nn.Module]) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        torch.manual_seed(0)
        return make().eval()
    return build


ARCHS: dict[str, Arch] = {a.name: a for a in (
    Arch("llama-sdpa", _seeded(lambda: _llama("sdpa")), lambda: {"input_ids": _tokens()}),
    Arch("llama-eager", _seeded(lambda: _llama("eager")), lambda: {"input_ids": _tokens()}),
    Arch("qwen2", _seeded(_qwen2), lambda: {"input_ids": _tokens()}),
    Arch("gpt2", _seeded(_gpt2), lambda: {"input_ids": _tokens()}),
    Arch("bert", _seeded(_bert), lambda: {"input_ids": _tokens(), "attention_mask": _padding_mask()}),
    Arch("t5", _seeded(_t5), lambda: {"input_ids": _tokens(), "attention_mask": _padding_mask(),
                                      "decoder_input_ids": _tokens(1, 4)}),
    Arch("vit", _seeded(_vit), lambda: {"pixel_values": torch.randn(1, 3, 32, 32,
                                                                     generator=torch.Generator().manual_seed(0))}),
    # recurrent: CUDA runs each RNN as one cuDNN kernel, CPU as oneDNN layers (kernel family "rnn")
    Arch("lstm-lm", _seeded(lambda: _RecurrentLM("LSTM")), lambda: {"input_ids": _tokens(14, 16)}),
    Arch("gru-lm", _seeded(lambda: _RecurrentLM("GRU")), lambda: {"input_ids": _tokens(15, 16)}),
    # held out: never used while the rules were written (scenarios.holdout)
    Arch("mistral", _seeded(_mistral), lambda: {"input_ids": _tokens(2)}),
    Arch("resnet", _seeded(_resnet), lambda: {"pixel_values": torch.randn(1, 3, 32, 32,
                                                                           generator=torch.Generator().manual_seed(1))}),
    Arch("gemma", _seeded(_gemma), lambda: {"input_ids": _tokens(3)}),
    Arch("convnext", _seeded(_convnext), lambda: {"pixel_values": torch.randn(1, 3, 32, 32,
                                                                               generator=torch.Generator().manual_seed(2))}),
    Arch("mixtral", _seeded(_mixtral), lambda: {"input_ids": _tokens(4)}),
    Arch("mobilenet", _seeded(_mobilenet), lambda: {"pixel_values": torch.randn(1, 3, 32, 32,
                                                                                 generator=torch.Generator().manual_seed(3))}),
    Arch("phi", _seeded(_phi), lambda: {"input_ids": _tokens(5)}),
    # an encoder-decoder on 1-D convolutions of audio features; shifted-window attention
    Arch("whisper", _seeded(_whisper), lambda: {
        "input_features": torch.randn(1, 16, 32, generator=torch.Generator().manual_seed(6)),
        "decoder_input_ids": _tokens(6, 6)}),
    Arch("swin", _seeded(_swin), lambda: {"pixel_values": torch.randn(1, 3, 32, 32,
                                                                       generator=torch.Generator().manual_seed(7))}),
    # ALiBi through baddbmm, a fused QKV projection; grouped convolutions with squeeze-excitation
    Arch("bloom", _seeded(_bloom), lambda: {"input_ids": _tokens(8)}),
    Arch("regnet", _seeded(_regnet), lambda: {"pixel_values": torch.randn(1, 3, 32, 32,
                                                                           generator=torch.Generator().manual_seed(9))}),
    # disentangled relative attention (gather over position buckets, a padding mask); overlapping
    # patch convolutions, attention over a sequence reduced by a strided convolution, a depthwise MLP
    Arch("deberta", _seeded(_deberta), lambda: {"input_ids": _tokens(10), "attention_mask": _padding_mask()}),
    Arch("segformer", _seeded(_segformer), lambda: {"pixel_values": torch.randn(
        1, 3, 32, 32, generator=torch.Generator().manual_seed(11))}),
    Arch("efficientnet", _seeded(_efficientnet), lambda: {"pixel_values": torch.randn(
        1, 3, 32, 32, generator=torch.Generator().manual_seed(4))}),
    # learned positions, ReLU, biased projections (a key bias); weight-standardized convolutions
    # (each forward normalizes its weight) with group norm, pre-activation bottlenecks
    Arch("opt", _seeded(_opt), lambda: {"input_ids": _tokens(12)}),
    Arch("bit", _seeded(_bit), lambda: {"pixel_values": torch.randn(1, 3, 32, 32,
                                                                     generator=torch.Generator().manual_seed(13))}),
    # a selective state-space model (no attention: a causal depthwise conv1d, a scan of per-step
    # matmuls, softplus time steps); convolutions with batch norm and SiLU around transformer blocks
    # over unfolded patches
    Arch("mamba", _seeded(_mamba), lambda: {"input_ids": _tokens(16)}),
    Arch("mobilevit", _seeded(_mobilevit), lambda: {"pixel_values": torch.randn(
        1, 3, 32, 32, generator=torch.Generator().manual_seed(17))}),
    # multi-query attention with attention and MLP in parallel off one layer norm, bias-free
    # projections; raw audio through strided 1-D convolutions with group norm, a weight-normed
    # positional convolution, a transformer encoder and mean pooling
    Arch("falcon", _seeded(_falcon), lambda: {"input_ids": _tokens(18)}),
    Arch("wav2vec2", _seeded(_wav2vec2), lambda: {"input_values": torch.randn(
        1, 800, generator=torch.Generator().manual_seed(19))}),
    # logit soft-capping (tanh) in attention and on the logits, sliding-window layers between
    # global ones, pre- and post-norms around each block; a convolution stem, then linear layers
    # each followed by batch norm, Hardswish, attention with a learned bias read by index
    Arch("gemma2", _seeded(_gemma2), lambda: {"input_ids": _tokens(20)}),
    Arch("levit", _seeded(_levit), lambda: {"pixel_values": torch.randn(
        1, 3, 64, 64, generator=torch.Generator().manual_seed(21))}),
    # RMS norms on the query and key projections (QK-norm) and after attention and MLP instead of
    # before; depthwise 7x7 convolutions, LayerNorm over channels, GELU and global response
    # normalization (a spatial L2 norm divided by its channel mean)
    Arch("olmo2", _seeded(_olmo2), lambda: {"input_ids": _tokens(23)}),
    Arch("convnextv2", _seeded(_convnextv2), lambda: {"pixel_values": torch.randn(
        1, 3, 64, 64, generator=torch.Generator().manual_seed(24))}),
)}


OPTIMIZERS = {  # how torch.optim runs a step: per-tensor ops (CPU's default), multi-tensor kernels
    "loop": {"foreach": False},  # (accelerators' default), one fused kernel
    "foreach": {"foreach": True},
    "fused": {"fused": True},
}


def run_model(model: torch.nn.Module, inputs: dict, backward: bool, optimizer: str | None = None) -> None:
    """One forward (and a backward of a scalar loss when asked), as a training step would; then
    one AdamW step of ``optimizer``'s implementation (OPTIMIZERS) when given."""
    out = model(**inputs)
    if backward or optimizer:
        out[0].float().square().mean().backward()
    if optimizer:
        torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, **OPTIMIZERS[optimizer]).step()
