"""Checked decoding of a columnar index's texts: shapes, module stacks, stacks and skeletons.

A record's skeleton is everything about it that is not a tensor, as JSON, with ``{"t": "@"}``
where each tensor goes (docs/format.md, version 3). Each distinct text is decoded once, with the
same limits as the JSON records of version 2, into a template that ``fill`` completes with the
record's tensors.
"""
from __future__ import annotations

import json
import math
from typing import Any, Iterator

from .errors import ColumnsError
from .model import (MAX_DEPTH, MAX_ITEMS, MAX_NAME, MAX_NUMEL, Sharding, TensorMeta, _frame, _ints, _str, echo,
                    parse_json, value_from_json)


def checked_name(text: str, what: str) -> str:
    return _str(text, what, MAX_NAME)


def _loads(text: str, what: str) -> Any:
    try:
        return parse_json(text)
    except RecursionError:
        raise ColumnsError(f"{what}: values nested too deep") from None
    except json.JSONDecodeError as e:
        raise ColumnsError(f"{what}: not JSON ({e})") from None


def parse_dims(text: str) -> tuple[int, ...]:
    """A shape or stride text: a list of at most MAX_DIMS int64 values. A stride has no element
    limit (a contiguous (4, 16, 512, 512) has strides whose product is 2**49; repeat_kv's
    expand gives strides of 0), so the shape's limits are ``check_shape``'s."""
    try:
        return _ints(_loads(text, "tensor shape or stride"), "tensor shape or stride")
    except ValueError as e:
        raise ColumnsError(str(e)) from None


def check_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape's own limits: no negative size, at most MAX_NUMEL elements (torch's int64 numel)."""
    if any(n < 0 for n in shape):
        raise ColumnsError(f"tensor shape has a negative size: {echo(list(shape))}")
    if math.prod(shape) > MAX_NUMEL:
        raise ColumnsError(f"tensor shape {echo(list(shape))} has more than 2**63-1 elements")
    return shape


def parse_frames(text: str) -> list[tuple[str, str]]:
    frames = _loads(text, "module_stack")
    if not isinstance(frames, list) or len(frames) > MAX_ITEMS:
        raise ColumnsError(f"module_stack must be a list, got {echo(frames)}")
    try:
        return [_frame(p) for p in frames]
    except ValueError as e:
        raise ColumnsError(str(e)) from None


def parse_text_list(text: str) -> list[str]:
    items = _loads(text, "stack")
    if not isinstance(items, list) or len(items) > MAX_ITEMS or not all(isinstance(x, str) for x in items):
        raise ColumnsError(f"stack must be a list of strings, got {echo(items)}")
    return items


class _Mark:
    """Where a skeleton holds a tensor."""


MARK = _Mark()


def parse_skeleton(text: str) -> tuple[dict, int]:
    """(template, number of tensors): the template holds decoded values with MARK for tensors."""
    raw = _loads(text, "record skeleton")
    if not isinstance(raw, dict) or not isinstance(raw.get("inputs"), dict) or not isinstance(raw.get("outputs"), list):
        raise ColumnsError(f"record skeleton must hold inputs and outputs, got {echo(raw)}")
    count = [0]

    def decode(v: Any, depth: int) -> Any:
        if isinstance(v, dict) and v.get("t") == "@" and len(v) == 1:
            count[0] += 1
            return MARK
        if isinstance(v, list):
            if depth >= MAX_DEPTH:
                raise ValueError(f"lists nested deeper than {MAX_DEPTH} levels")
            if len(v) > MAX_ITEMS:
                raise ValueError(f"a list of {len(v)} items (limit {MAX_ITEMS})")
            return [decode(x, depth + 1) for x in v]
        if isinstance(v, dict) and v.get("t") == "tensor":
            raise ValueError("a tensor inside a skeleton (tensors are rows)")
        return value_from_json(v, depth)

    try:
        if len(raw["inputs"]) > MAX_ITEMS or len(raw["outputs"]) > MAX_ITEMS:
            raise ValueError("too many arguments")
        template = {"inputs": {_str(k, "input name"): decode(v, 0) for k, v in raw["inputs"].items()},
                    "outputs": [decode(v, 0) for v in raw["outputs"]]}
        for key in ("mutates", "params"):
            items = raw.get(key, [])
            if not isinstance(items, list) or len(items) > MAX_ITEMS:
                raise ValueError(f"{key} must be a list")
            template[key] = [_str(x, key) for x in items]
        keywords = raw.get("keywords", {})
        if not isinstance(keywords, dict) or len(keywords) > MAX_ITEMS:
            raise ValueError("keywords must be an object")
        template["keywords"] = {_str(k, "keyword key"): _str(v, "keyword") for k, v in keywords.items()}
        sharding = raw.get("sharding", {})  # DTensors' shards, by tensor name (optional)
        if not isinstance(sharding, dict) or len(sharding) > MAX_ITEMS:
            raise ValueError("sharding must be an object")
        template["sharding"] = {_str(k, "sharded tensor name"): Sharding.from_json(v) for k, v in sharding.items()}
        kernels = raw.get("kernels", 0)  # a DTensor call: the records of its kernels, just before it
        if type(kernels) is not int or not 0 <= kernels < 2 ** 63:
            raise ValueError(f"kernels must be a count, got {echo(kernels)}")
        template["kernels"] = kernels
    except ValueError as e:
        raise ColumnsError(f"record skeleton: {e}") from None
    return template, count[0] + len(template["params"])


def marks(v: Any) -> int:
    """How many tensors a decoded skeleton value holds."""
    if v is MARK:
        return 1
    return sum(map(marks, v)) if isinstance(v, list) else 0


def fill(v: Any, metas: Iterator[TensorMeta]) -> Any:
    if v is MARK:
        return next(metas)
    if isinstance(v, list):
        return [fill(x, metas) for x in v]
    return v  # decoded scalars are immutable (Scalar is frozen) or plain values
