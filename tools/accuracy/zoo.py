"""Every model class of the installed transformers (one per architecture family), built tiny or
at a real width.

The list comes from the library itself: ``MODEL_MAPPING_NAMES`` (model_type -> base model class).
A tiny config is the family's default config with every size it has set small, in nested
sub-configs too: the names ``TINY`` lists, then any int field whose name reads as a depth, a head
count, a width or a vocabulary; per-layer lists cut with the layer count; special token ids moved
into the tiny vocabulary. Nothing per family is written here, so a family this cannot shrink or
feed is reported "not buildable" with the reason, never hidden. Inputs follow ``main_input_name``
and every argument the forward requires, each made by the conventions of its name.

At a real width (``size="real"``: tiny configs hide bugs) the same shrunk config takes the sizes
``REAL`` lists instead, a 1024-wide model of two layers with 16 query heads on 4 key/value heads,
fed 512 tokens; the other sizes (depth, vocabulary, image, a convolution's per-stage channel
lists) stay tiny.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

import torch

from xray.demo.models import _quiet_import

from .archs import ARCHS, Arch

SEQ, IMAGE, VOCAB = 8, 32, 128
REAL_SEQ = 512  # tokens a real-width model is fed
# a config still this large after shrinking (a size this does not know) is not run, per size
MAX_PARAMS = {"tiny": 5_000_000, "wider": 5_000_000, "real": 150_000_000}

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
    "qk_head_dim": 16,
    "v_head_dim": 8, "first_k_dense_replace": 1,
    "vocab_size": VOCAB, "max_position_embeddings": 64, "n_positions": 64,
    "image_size": IMAGE, "patch_size": 8, "num_channels": 3, "num_mel_bins": 16, "max_source_positions": 16,
    "max_target_positions": 32, "state_size": 8, "time_step_rank": 4, "conv_kernel": 4,
    "num_labels": 4, "type_vocab_size": 2, "sliding_window": 4,
    "expand": 1, "mamba_expand": 1,  # SSM inner width = heads x head size = hidden x expand: 4 x 8 = 32 x 1
}
# the second try: two wider heads (a head size of 32, rotary widths and per-head splits that need it)
WIDER = {"hidden_size": 64, "d_model": 64, "n_embd": 64, "embed_dim": 64, "dim": 64, "hidden_dim": 64,
         "num_attention_heads": 2, "n_head": 2, "n_heads": 2, "num_heads": 2, "encoder_attention_heads": 2,
         "decoder_attention_heads": 2, "num_key_value_heads": 2, "num_kv_heads": 2, "n_kv_heads": 2,
         "head_dim": 32, "d_kv": 32, "kv_channels": 32, "attention_head_dim": 32, "rotary_dim": 32,
         "intermediate_size": 128, "qk_rope_head_dim": 16, "qk_nope_head_dim": 16, "qk_head_dim": 32,
         "v_head_dim": 32}
# a real width: what a small production model has per layer (Llama-3.2-1B's attention, a narrower MLP)
REAL = {**{k: 1024 for k in ("hidden_size", "d_model", "n_embd", "embed_dim", "dim", "hidden_dim", "n_embed",
                              "word_embed_proj_dim", "projection_dim")},
        **{k: 16 for k in ("num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads",
                           "decoder_attention_heads")},
        **{k: 4 for k in ("num_key_value_heads", "num_kv_heads", "n_kv_heads")},
        **{k: 64 for k in ("head_dim", "d_kv", "kv_channels", "attention_head_dim", "rotary_dim", "qk_head_dim",
                           "v_head_dim")},
        **{k: 2816 for k in ("intermediate_size", "ffn_dim", "d_ff", "n_inner", "encoder_ffn_dim", "decoder_ffn_dim")},
        "moe_intermediate_size": 704, "shared_expert_intermediate_size": 704, "qk_rope_head_dim": 32,
        "qk_nope_head_dim": 32, "q_lora_rank": 256, "kv_lora_rank": 256,
        **{k: 2 * REAL_SEQ for k in ("max_position_embeddings", "n_positions", "max_source_positions",
                                      "max_target_positions")},
        "sliding_window": REAL_SEQ // 2}
SIZES = {"tiny": TINY, "wider": {**TINY, **WIDER}, "real": {**TINY, **REAL}}
# per size, the most a field read by its name's convention keeps: head size, heads, feed-forward width, width
BY_NAME = {"tiny": (8, 4, 64, 32), "wider": (32, 2, 128, 64), "real": (64, 16, 2816, 1024)}


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


# -- shrinking: every size a config (or any config nested in it) has, by name --------------------
# Names TINY does not list are read by convention: the parts of a name say what kind of size it is.
DEPTH_WORDS = ("layers", "depth", "num_blocks", "num_block_repeats")  # counts of stacked blocks
HEAD_WORDS = ("heads",)
FFN_WORDS = ("intermediate", "ffn", "mlp_dim", "d_ff", "d_inner", "feedforward", "linear_units")
WIDTH_WORDS = ("hidden_size", "hidden_dim", "hidden_channels", "embed_dim", "embedding_dim", "embedding_size",
               "d_model", "out_hidden_size", "codebook_dim", "condition_dim", "channels", "projection",
               "latent_dim", "_width", "dim_model")
NOT_A_SIZE = ("num_channels", "in_channels", "input_", "in_dim", "kernel", "stride", "ratio", "factor",
              "chunk", "window", "patch", "position", "merge", "_token", "_id", "rate", "bucket", "temperature",
              "num_labels", "per_layer", "_per_", "offset", "label", "channels_last", "audio_channels", "max_")
LIST_WIDTH_WORDS = ("hidden_sizes", "channels", "dims", "conv_dim", "embed_dims")
LIST_DEPTH_WORDS = ("depths", "repeats", "num_blocks", "numb_of_layers", "num_layers")
LIST_HEAD_WORDS = ("num_heads", "num_attention_heads", "heads")
TOKEN_ID_ENDS = ("token_id", "token_index", "_id", "_index")
NOT_A_TOKEN_ID = ("layer", "lang", "eval", "feature", "head_in", "ignore", "insert", "decode", "merge", "pos",
                  "altup", "seed", "conditional")


# a count this small may be of stages, not layers: lists of that length then are per-stage lists
MAX_STAGES = 4
# fields a config derives from its layer count when they are not given (a backbone's stage names)
DERIVED = ("stage_names", "out_features", "out_indices")


def _fit_mrope(d: dict, cls) -> None:
    """Multimodal rotary sections (time, height, width) split half the rotated head width. A config
    whose class says it takes ``mrope_section`` gets sections for the tiny head size, in the
    proportions it had (its modelling code's default when the config has none)."""
    if "mrope_section" not in getattr(cls, "ignore_keys_at_rope_validation", ()):
        return
    key = "rope_parameters" if isinstance(d.get("rope_parameters"), dict) else "rope_scaling"
    rope = d.get(key) or {}
    head = d.get("head_dim") or d.get("hidden_size", 0) // max(1, d.get("num_attention_heads") or 1)
    factor = rope.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0)) or 1.0
    total, sections = int(head * factor) // 2, rope.get("mrope_section") or [16, 24, 24]
    scaled = [x * total // sum(sections) for x in sections]
    scaled[-1] += total - sum(scaled)
    d[key] = {**rope, "mrope_section": scaled}


def _words(name: str, words) -> bool:
    return any(w in name for w in words)


def _tiny_int(name: str, value: int, size: str) -> int | None:
    """The value at ``size`` (SIZES) for one int field, or None to leave it: the size's names first,
    then the field's name read as a depth, a head count, a feed-forward width or a width."""
    table, (head_size, heads, ffn, width) = SIZES[size], BY_NAME[size]
    if name in table:
        return table[name]
    if value <= 1 or _words(name, NOT_A_SIZE):
        return None
    if _words(name, DEPTH_WORDS):
        return min(value, 2)
    if name.endswith(("head_dim", "head_size", "dim_head", "d_head", "headdim")):
        return min(value, head_size)
    if _words(name, HEAD_WORDS):
        return min(value, heads)
    if name.endswith("vocab_size"):
        return min(value, VOCAB)
    if _words(name, FFN_WORDS):
        return min(value, ffn)
    if _words(name, WIDTH_WORDS) or name == "dim":
        return min(value, width)
    return None


def _tiny_list(name: str, value: list) -> list | None:
    """Per-stage lists (widths, depths, heads), kept at their length with small values. Widths are all
    one value so that a stage's output always matches the next stage's input; a width of 4 or less is
    an image's or a signal's own channel count and stays."""
    if not value or not all(isinstance(x, int) and not isinstance(x, bool) for x in value):
        return None
    if _words(name, LIST_HEAD_WORDS):
        return [min(x, 2) for x in value]
    if _words(name, LIST_DEPTH_WORDS):
        return [min(x, 1) for x in value]
    if _words(name, LIST_WIDTH_WORDS) and not _words(name, ("kernel", "stride", "ratio", "input_channels")):
        return [x if x <= 4 else 32 for x in value]
    return None


def _per_layer(value: list, old: int, new: int) -> list:
    """A per-layer list (layer types, which layers are sparse...) cut to ``new`` layers, keeping one
    layer of every kind it had where it can (a hybrid model keeps its attention and its SSM layer)."""
    firsts = sorted({repr(v): i for i, v in reversed(list(enumerate(value)))}.values())
    keep = sorted((firsts + [i for i in range(old) if i not in firsts])[:new])
    return [value[i] for i in keep]


def _layer_indices(value: list, old: int, new: int) -> list:
    """Layer indices (global-attention layers, hybrid layers) mapped onto ``new`` layers."""
    return sorted({min(new - 1, i * new // old) for i in value})


def _is_token_id(name: str) -> bool:
    return name.endswith(TOKEN_ID_ENDS) and not _words(name, NOT_A_TOKEN_ID)


def _token_ids(d: dict, out: set) -> set:
    """Every special token id in a config dict and the configs nested in it."""
    for k, v in d.items():
        if _is_config(v):
            _token_ids(v, out)
        elif isinstance(k, str) and _is_token_id(k):
            for x in v if isinstance(v, list) else [v]:
                if isinstance(x, int) and not isinstance(x, bool) and x >= 0:
                    out.add(x)
    return out


def _id_map(d: dict) -> dict[int, int]:
    """Special token ids past the tiny vocabulary, each moved to its own id at the top of it (kept
    distinct: an image token must not become the padding token), the same way in every sub-config."""
    big = sorted(x for x in _token_ids(d, set()) if x >= VOCAB)
    return {x: VOCAB - 1 - i for i, x in enumerate(big)}


def _shrink_dict(d: dict, size: str, ids: dict[int, int], classes: dict, stages: int = 0) -> dict:
    """A config's dict with every size small, nested configs (dicts with a model_type) included; lists
    of one entry per layer cut with the layer count, so that the config's validators still hold
    (``stages``: a count up to this is of stages, whose lists are kept whole)."""
    out = dict(d)
    depths = {}
    for k, v in d.items():
        if _is_config(v):
            out[k] = _shrink_dict(v, size, ids, classes, stages)
        elif isinstance(v, bool) or v is None:
            continue
        elif _is_token_id(k):
            out[k] = [ids.get(x, x) for x in v] if isinstance(v, list) else ids.get(v, v)
        elif isinstance(v, int):
            tiny = _tiny_int(k, v, size)
            if tiny is not None:
                out[k] = tiny
                if _words(k, DEPTH_WORDS) and tiny < v and v > stages:
                    depths[v] = tiny
        elif isinstance(v, list):
            tiny = _tiny_list(k, v)
            if tiny is not None:
                out[k] = tiny
    for k, v in d.items():  # lists of one entry per layer, and lists of layer indices
        if not isinstance(v, list) or not v:
            continue
        if len(v) in depths:
            out[k] = _per_layer(out[k], len(v), depths[len(v)])
        elif out[k] is v and "layer" in k and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            old = max((o for o in depths if o > max(v)), default=None)
            if old is not None:
                out[k] = _layer_indices(v, old, depths[old])
    for k in DERIVED:
        out.pop(k, None)
    _fit_mrope(out, classes.get(d.get("model_type")))
    return out


def tiny_config(model_type: str, size: str = "tiny"):
    """The family's default config rebuilt from its dict with every size small (``size``: "wider",
    the WIDER sizes, for families whose head size or rotary width must be larger; "real", the REAL
    widths). Rebuilding the whole dict at
    once (sub-configs included) lets the config's own validators check the shrunk sizes together."""
    with _quiet_import():
        from transformers import AutoConfig
    default = AutoConfig.for_model(model_type)
    d = default.to_dict()
    for stages in (MAX_STAGES, 0):  # a short list may be per stage (kept) or, if the config says no, per layer
        shrunk = _shrink_dict(d, size, _id_map(d), _config_classes(default, {}), stages)
        # top level: only what changed, so that fields the config derives from a size are derived again
        try:
            return type(default)(**{k: v for k, v in shrunk.items() if k not in d or v != d[k] or _is_config(v)})
        except Exception:  # noqa: BLE001 - the config's validator said no: the other reading
            if not stages:
                raise


def _is_config(v) -> bool:
    return isinstance(v, dict) and "model_type" in v


def _config_classes(config, out: dict) -> dict:
    """model_type -> config class of a config and of every config nested in it."""
    with _quiet_import():
        from transformers import PretrainedConfig
    out[config.model_type] = type(config)
    for v in vars(config).values():
        if isinstance(v, PretrainedConfig):
            _config_classes(v, out)
    return out


def _model_class(entry: Entry):
    import transformers

    return getattr(transformers, entry.cls)


# inputs a model takes as (1, SEQ, width) floats, the width being this config field (or 1): the
# arguments of reinforcement-learning models, whose names say nothing of their shape
TRAJECTORY = {"states": "state_dim", "actions": "act_dim", "rewards": None, "returns_to_go": None,
              "state": "max_state_dim"}
GRID = 4  # patches per side of the one image a flattened-patch vision model gets (a multiple of its merge size)


def inputs_for(model: torch.nn.Module, seq: int = SEQ) -> dict:
    """Inputs from the model's main input name and every other argument its forward requires (and a
    decoder's ids for encoder-decoders), each made by the conventions of its name (``_input``), of
    ``seq`` tokens."""
    config = model.config
    params = inspect.signature(model.forward).parameters
    required = [n for n, p in params.items() if p.default is p.empty
                and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and n != "self"]
    name = getattr(model, "main_input_name", "input_ids")
    if name not in params and required:  # a main input name inherited from a text model
        name = required[0]
    g = torch.Generator().manual_seed(0)
    x: dict = {}
    # optional arguments a model still cannot run without (boxes of a layout model, a trajectory's parts)
    wanted = [n for n in ("bbox", "timesteps", *TRAJECTORY) if n in params]
    for arg in [name, *required, *wanted]:
        if arg not in x:
            x[arg] = _input(arg, config, params, x, g, seq)
    if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in params:
        x["decoder_input_ids"] = _ids(config, seq // 2, g)
    return x


def _ids(config, n: int, g) -> torch.Tensor:
    """Token ids, none of them a special token (an image token would ask for an image)."""
    vocab = min(getattr(config, "vocab_size", None) or VOCAB, VOCAB)
    special = _token_ids(config.to_dict(), set())
    allowed = torch.tensor([i for i in range(3, vocab) if i not in special] or [vocab - 1])
    return allowed[torch.randint(0, len(allowed), (1, n), generator=g)]


def _input(name: str, config, params, x: dict, g, seq: int = SEQ) -> torch.Tensor:
    """One argument, by the conventions of its name."""
    width = getattr(config, "hidden_size", None) or 32
    if name.endswith("input_ids"):
        return _ids(config, seq, g)
    if "grid_thw" in name:
        return torch.tensor([[1, GRID, GRID]])
    if name in ("pixel_values", "hidden_states") and any("grid_thw" in p for p in params):
        return torch.randn(GRID * GRID, _patch_width(config), generator=g)
    if name in ("pixel_values", "pixel_values_videos"):
        channels = getattr(config, "num_channels", 3) or 3
        size = getattr(config, "image_size", IMAGE)
        size = size[0] if isinstance(size, (list, tuple)) else size
        frames = getattr(config, "num_frames", None)
        shape = (1, frames, channels, size, size) if frames else (1, channels, size, size)
        return torch.randn(*shape, generator=g)
    if name == "input_features":
        bins = getattr(config, "num_mel_bins", None) or getattr(config, "feature_size", 16)
        frames = 2 * (getattr(config, "max_source_positions", None) or seq)
        return torch.randn(1, bins, frames, generator=g)
    if name.endswith("_mask") and name[:-5] in x:  # a mask of every position of the input it names
        of = x[name[:-5]]
        return torch.ones(1, of.shape[-1] if name == "input_features_mask" else of.shape[1], dtype=torch.long)
    if name == "input_values":
        return torch.randn(1, 1600, generator=g)
    if name in ("inputs_embeds", "past_values", "values", "query_embeds"):
        return torch.randn(1, getattr(config, "num_query_tokens", None) or seq, width, generator=g)
    if name == "bbox":  # boxes as (x0, y0, x1, y1), top-left before bottom-right
        corners = torch.randint(0, 500, (1, seq, 2), generator=g)
        return torch.cat([corners, corners + 10], dim=-1)
    if name in TRAJECTORY:
        field = TRAJECTORY[name]
        return torch.randn(1, seq, getattr(config, field, 1) if field else 1, generator=g)
    if name == "timesteps":
        return torch.arange(seq).unsqueeze(0)
    raise ValueError(f"input {name!r}: no generic input for it")


def _patch_width(config) -> int:
    """A flattened patch's width: channels x frames per patch x patch area."""
    channels = getattr(config, "in_channels", None) or getattr(config, "num_channels", 3)
    return channels * (getattr(config, "temporal_patch_size", 1) or 1) * getattr(config, "patch_size", 14) ** 2


def builder(entry: Entry, size: str = "tiny") -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        torch.manual_seed(0)
        with _quiet_import():
            cls = _model_class(entry)
            config = tiny_config(entry.model_type, size)
            with torch.device("meta"):
                n = sum(p.numel() for p in cls(config).parameters())
            if n > MAX_PARAMS[size]:
                raise ValueError(f"{n / 1e6:.1f} M parameters after shrinking (limit {MAX_PARAMS[size] / 1e6:.0f} M)")
            torch.manual_seed(0)
            return cls(config).eval()
    return build


def first_output(out) -> torch.Tensor:
    """The model's main output: run_model's ``out[0]``."""
    return out[0]


def _first_line(e: Exception) -> str:
    """The error's first non-blank line (a missing optional package's message starts with a newline)."""
    return next((line.strip()[:200] for line in str(e).splitlines() if line.strip()), "")


def register(entry: Entry, size: str = "tiny") -> str:
    """Build ``entry`` tiny, check a forward runs, and add it to ARCHS (as ``zoo/<model_type>``) so
    the accuracy runner's scenarios can name it. Tries TINY, then WIDER; raises with the reason
    the tiny config gave when neither builds and runs. ``size="real"``: the REAL widths on
    REAL_SEQ tokens instead (as ``zoo-real/<model_type>``)."""
    errors = []
    seq = REAL_SEQ if size == "real" else SEQ
    for tried in (("real",) if size == "real" else ("tiny", "wider")):
        build = builder(entry, tried)
        try:
            model = build()
            x = inputs_for(model, seq)
            out = first_output(model(**x))
            if not isinstance(out, torch.Tensor) or not out.is_floating_point():
                raise ValueError(f"first output is {type(out).__name__}, not a float tensor")
        except Exception as e:  # noqa: BLE001 - the reason is the result
            errors.append(f"{type(e).__name__}: {_first_line(e)}")
            continue
        name = f"zoo-real/{entry.model_type}" if size == "real" else f"zoo/{entry.model_type}"
        ARCHS[name] = Arch(name, build, lambda model=model: inputs_for(model, seq))
        return name
    raise ValueError(errors[0])
