"""Every model class of the installed transformers (one per architecture family), built tiny.

The list comes from the library itself: ``MODEL_MAPPING_NAMES`` (model_type -> base model class).
A tiny config is the family's default config with every size attribute it has set small
(``TINY``): nothing per family is written here, so a family this cannot shrink or feed is
reported "not buildable" with the reason, never hidden. Inputs follow ``main_input_name``.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

import torch

from xray.demo.models import _quiet_import

from .archs import ARCHS, Arch

SEQ, IMAGE, VOCAB = 8, 32, 128
MAX_PARAMS = 5_000_000  # a config still this large after shrinking (a size this does not know) is not run

# size attributes, set wherever a config has them (aliases included: attribute_map resolves them)
TINY: dict[str, Any] = {
    "hidden_size": 32, "d_model": 32, "n_embd": 32, "embed_dim": 32, "dim": 32, "d_embed": 32, "emb_dim": 32,
    "hidden_dim": 32, "n_embed": 32, "word_embed_proj_dim": 32, "projection_dim": 32, "proj_size": 32,
    "num_hidden_layers": 2, "num_layers": 2, "n_layer": 2, "n_layers": 2, "num_decoder_layers": 2,
    "encoder_layers": 2, "decoder_layers": 2, "num_encoder_layers": 2,
    "num_attention_heads": 4, "n_head": 4, "n_heads": 4, "num_heads": 4, "encoder_attention_heads": 4,
    "decoder_attention_heads": 4, "num_key_value_heads": 2, "num_kv_heads": 2, "n_kv_heads": 2,
    "head_dim": 8, "d_kv": 8, "kv_channels": 8, "attention_head_dim": 8, "rotary_dim": 8,
    "intermediate_size": 64, "ffn_dim": 64, "d_ff": 64, "n_inner": 64, "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 1,
    "topk_group": 1, "q_lora_rank": 16, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
    "v_head_dim": 8, "first_k_dense_replace": 1,
    "vocab_size": VOCAB, "max_position_embeddings": 64, "n_positions": 64,
    "image_size": IMAGE, "patch_size": 8, "num_channels": 3, "num_mel_bins": 16, "max_source_positions": 16,
    "max_target_positions": 32, "state_size": 8, "time_step_rank": 4, "conv_kernel": 4,
    "num_labels": 4, "type_vocab_size": 2, "sliding_window": 4,
}
# the second try: two wider heads (a head size of 32, rotary widths and per-head splits that need it)
WIDER = {"hidden_size": 64, "d_model": 64, "n_embd": 64, "embed_dim": 64, "dim": 64, "hidden_dim": 64,
         "num_attention_heads": 2, "n_head": 2, "n_heads": 2, "num_heads": 2, "encoder_attention_heads": 2,
         "decoder_attention_heads": 2, "num_key_value_heads": 2, "num_kv_heads": 2, "n_kv_heads": 2,
         "head_dim": 32, "d_kv": 32, "kv_channels": 32, "attention_head_dim": 32, "rotary_dim": 32,
         "intermediate_size": 128, "qk_rope_head_dim": 16, "qk_nope_head_dim": 16, "v_head_dim": 32}
TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id",
             "cls_token_id", "mask_token_id", "unk_token_id")
LISTS = ("hidden_sizes", "depths", "embed_dims", "num_heads", "num_attention_heads", "neck_hidden_sizes")


@dataclass(frozen=True)
class Entry:
    """One architecture family of the installed library: its model_type and model class name."""

    model_type: str
    cls: str
    source: str = "transformers"


def listed() -> list[Entry]:
    """Every model_type with a base model class, as the installed transformers maps them."""
    with _quiet_import():
        from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES
    out = []
    for model_type, names in sorted(MODEL_MAPPING_NAMES.items()):
        out.append(Entry(model_type, names[0] if isinstance(names, (tuple, list)) else names))
    return out


def _shrink_lists(config) -> dict:
    """Per-stage lists (hidden_sizes, depths, heads) kept at their length, with small values."""
    kw = {}
    heads = getattr(config, "num_attention_heads", None) or getattr(config, "num_heads", None)
    for name in LISTS:
        v = getattr(config, name, None)
        if not isinstance(v, (list, tuple)) or not v or not all(isinstance(x, int) for x in v):
            continue
        if name == "depths":
            kw[name] = [1] * len(v)
        elif name in ("num_heads", "num_attention_heads"):
            kw[name] = [min(x, 2) for x in v]
        elif isinstance(heads, (list, tuple)) and len(heads) == len(v):
            kw[name] = [16 * min(h, 2) for h in heads]
        else:
            kw[name] = [16 * 2 ** min(i, 2) for i in range(len(v))]
    return kw


def tiny_config(model_type: str, wider: bool = False):
    """The family's default config with every size it has set small (``wider``: the WIDER sizes,
    for families whose head size or rotary width must be larger)."""
    with _quiet_import():
        from transformers import AutoConfig, PretrainedConfig
    default = AutoConfig.for_model(model_type)
    kw = {k: (WIDER.get(k, v) if wider else v) for k, v in TINY.items() if _has(default, k)}
    kw.update(_shrink_lists(default))
    kw.update({k: min(getattr(default, k), VOCAB - 1) for k in TOKEN_IDS
               if isinstance(getattr(default, k, None), int)})
    config = type(default)(**kw)
    for name, sub in list(vars(config).items()):  # composite models: text/vision/encoder sub-configs
        if isinstance(sub, PretrainedConfig):
            setattr(config, name, _shrunk(sub, wider))
    return config


def _shrunk(sub, wider: bool):
    kw = {k: (WIDER.get(k, v) if wider else v) for k, v in TINY.items() if _has(sub, k)}
    kw.update(_shrink_lists(sub))
    try:
        return type(sub)(**{**sub.to_dict(), **kw})
    except Exception:  # noqa: BLE001 - a sub-config this cannot rebuild stays as it was
        return sub


def _has(config, name: str) -> bool:
    try:
        v = getattr(config, name)
    except AttributeError:
        return False
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _model_class(entry: Entry):
    import transformers

    return getattr(transformers, entry.cls)


def inputs_for(model: torch.nn.Module) -> dict:
    """Inputs from the model's main input name (and a decoder's, for encoder-decoders)."""
    config = model.config
    name = getattr(model, "main_input_name", "input_ids")
    g = torch.Generator().manual_seed(0)
    params = inspect.signature(model.forward).parameters
    vocab = getattr(config, "vocab_size", None) or VOCAB
    if name == "input_ids":
        x = {"input_ids": torch.randint(3, min(vocab, VOCAB), (1, SEQ), generator=g)}
    elif name in ("pixel_values", "pixel_values_videos"):
        channels = getattr(config, "num_channels", 3) or 3
        size = getattr(config, "image_size", IMAGE)
        size = size[0] if isinstance(size, (list, tuple)) else size
        x = {name: torch.randn(1, channels, size, size, generator=g)}
    elif name == "input_features":
        bins = getattr(config, "num_mel_bins", None) or getattr(config, "feature_size", 16)
        frames = 2 * (getattr(config, "max_source_positions", None) or SEQ)
        x = {name: torch.randn(1, bins, frames, generator=g)}
    elif name == "input_values":
        x = {name: torch.randn(1, 1600, generator=g)}
    elif name in ("inputs_embeds", "past_values", "values"):
        width = getattr(config, "hidden_size", 32)
        x = {name: torch.randn(1, SEQ, width, generator=g)}
    else:
        raise ValueError(f"main input {name!r}: no generic input for it")
    if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in params:
        x["decoder_input_ids"] = torch.randint(3, min(vocab, VOCAB), (1, SEQ // 2), generator=g)
    return x


def builder(entry: Entry, wider: bool = False) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        torch.manual_seed(0)
        with _quiet_import():
            cls = _model_class(entry)
            config = tiny_config(entry.model_type, wider)
            with torch.device("meta"):
                n = sum(p.numel() for p in cls(config).parameters())
            if n > MAX_PARAMS:
                raise ValueError(f"{n / 1e6:.1f} M parameters after shrinking (limit {MAX_PARAMS / 1e6:.0f} M)")
            torch.manual_seed(0)
            return cls(config).eval()
    return build


def first_output(out) -> torch.Tensor:
    """The model's main output: run_model's ``out[0]``."""
    return out[0]


def register(entry: Entry) -> str:
    """Build ``entry`` tiny, check a forward runs, and add it to ARCHS (as ``zoo/<model_type>``) so
    the accuracy runner's scenarios can name it. Tries TINY, then WIDER; raises with the reason
    the tiny config gave when neither builds and runs."""
    errors = []
    for wider in (False, True):
        build = builder(entry, wider)
        try:
            model = build()
            x = inputs_for(model)
            out = first_output(model(**x))
            if not isinstance(out, torch.Tensor) or not out.is_floating_point():
                raise ValueError(f"first output is {type(out).__name__}, not a float tensor")
        except Exception as e:  # noqa: BLE001 - the reason is the result
            errors.append(f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
            continue
        name = f"zoo/{entry.model_type}"
        ARCHS[name] = Arch(name, build, lambda model=model: inputs_for(model))
        return name
    raise ValueError(errors[0])
