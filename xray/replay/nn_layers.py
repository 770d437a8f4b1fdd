"""torch.nn layers by class name: what a sweep's module entries build, and what module replay
rebuilds from a sweep's records (the ``torch.nn`` factory), so both build a layer the same way."""
from __future__ import annotations

import re
from typing import Any

import torch

from ..dump.model import Record, echo
from .sweep_values import MAX_ELEMENTS, _plain

# The model "factory" of a sweep (xray/replay/sweep.py): each module record is built alone as
# torch.nn.<record.op>(**its init arguments), no user code involved. Not a valid --model spec.
TORCH_NN = "torch.nn"

# torch.nn classes that hold other modules (or nothing to run): their arguments are not plain values.
_CONTAINERS = frozenset({"Module", "Sequential", "ModuleList", "ModuleDict", "ParameterList", "ParameterDict",
                         "Container", "Identity"})
_CLASS_RE = re.compile(r"^[A-Z][A-Za-z0-9_]{0,63}$")
_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def nn_class(name: Any) -> type[torch.nn.Module]:
    """The ``torch.nn`` module class called ``name`` (``Conv2d``, ``nn.Conv2d``, ``torch.nn.Conv2d``).

    Only classes defined in ``torch.nn.modules`` and not containers: nothing is imported, nothing
    outside torch.nn is reachable. Used when the spec is read and again in each replay worker.
    """
    short = name.removeprefix("torch.").removeprefix("nn.") if isinstance(name, str) else None
    cls = getattr(torch.nn, short, None) if short and _CLASS_RE.match(short) else None
    if (not isinstance(cls, type) or not issubclass(cls, torch.nn.Module) or short in _CONTAINERS
            or not cls.__module__.startswith("torch.nn.modules.")):
        raise ValueError(f"module {echo(name)} is not a torch.nn layer class (e.g. torch.nn.Conv2d); "
                         "only torch.nn classes by name can be swept")
    return cls


def build_nn_module(cls_name: str, init: dict[str, Any]) -> torch.nn.Module:
    """``torch.nn.<cls_name>(**init)`` in eval mode, the init values plain (lists, numbers, strings),
    its parameters and buffers at most MAX_ELEMENTS (counted on the meta device first)."""
    cls = nn_class(cls_name)
    for k, v in init.items():
        if not _IDENT_RE.match(k) or k in ("device", "dtype"):
            raise ValueError(f"init argument {echo(k)} is not allowed")
        _plain(v, f"init.{k}")
    if torch.get_default_device().type != "meta":
        with torch.device("meta"):
            n = sum(t.numel() for t in cls(**init).state_dict().values())
        if n > MAX_ELEMENTS:
            raise ValueError(f"{n} parameter elements (limit {MAX_ELEMENTS})")
    return cls(**init).eval()


# Module records of a sweep carry the class's init arguments as non-tensor inputs "init.<name>";
# replay's module input order (xray.replay.modules.input_order) skips them.
INIT_PREFIX = "init."


def init_args(record: Record) -> dict[str, Any]:
    return {k[len(INIT_PREFIX):]: v for k, v in record.inputs.items() if k.startswith(INIT_PREFIX)}
