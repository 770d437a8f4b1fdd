"""``MODEL`` specs of ``xray drift``: ``pkg.module:function`` or ``path/to/file.py:function``.

The function takes no arguments and returns ``(model, example_args)`` or
``(model, example_args, example_kwargs)``: the model and one real input, which is all
torch.export needs and all a drift run compares on.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any, Callable


class ModelSpecError(ValueError):
    """A MODEL spec that cannot be loaded or returned something else than (model, args[, kwargs])."""


def load_factory(spec: str) -> Callable[[], Any]:
    """The function named by ``spec``; a ``.py`` path is imported as a fresh module."""
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name:
        raise ModelSpecError(f"MODEL {spec!r}: write pkg.module:function or path/to/file.py:function "
                             "(e.g. mymodel.py:build)")
    if target.endswith(".py") or "/" in target:
        path = Path(target)
        if not path.is_file():
            raise ModelSpecError(f"MODEL {spec!r}: no such file {path}")
        mod_name = f"_xray_drift_model_{path.stem}"
        loader = importlib.util.spec_from_file_location(mod_name, path)
        if loader is None or loader.loader is None:
            raise ModelSpecError(f"MODEL {spec!r}: {path} is not importable as Python")
        module = importlib.util.module_from_spec(loader)
        sys.modules[mod_name] = module
        loader.loader.exec_module(module)
    else:
        # as ``python -m``: a module in the current folder imports (console scripts lack it on sys.path)
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            file = target.replace(".", "/") + ".py"
            raise ModelSpecError(f"MODEL {spec!r}: cannot import {target}: {e}; for a file, write "
                                 f"path/to/{file}:{name} (e.g. ./{file}:{name})") from e
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ModelSpecError(f"MODEL {spec!r}: {target} has no function {name!r}")
    return fn


def unpack(result: Any, where: str = "the model function") -> tuple[Any, tuple, dict]:
    """``(model, args)`` or ``(model, args, kwargs)`` -> (model, args tuple, kwargs dict)."""
    if not isinstance(result, tuple) or len(result) not in (2, 3):
        raise ModelSpecError(f"{where} must return (model, example_args) or (model, example_args, example_kwargs), "
                             f"got {type(result).__name__}")
    model, args = result[0], result[1]
    kwargs = result[2] if len(result) == 3 else {}
    if not isinstance(args, tuple):
        args = (args,)
    if not isinstance(kwargs, dict):
        raise ModelSpecError(f"{where}: example_kwargs must be a dict, got {type(kwargs).__name__}")
    return model, args, dict(kwargs)


def load_model(spec: str) -> tuple[Any, tuple, dict]:
    """Import ``spec``, call it, and return (model, args, kwargs)."""
    return unpack(load_factory(spec)(), f"MODEL {spec!r}")
