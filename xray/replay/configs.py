"""The deployment configuration matrix: axes of a YAML file crossed into backend specs.

```yaml
sweep: common                                  # what to replay (a sweep spec; --spec or a dump wins)
flows: [onnxrt-cpu, executorch-xnnpack]        # lowering flow / partitioner: backend presets, options allowed
dtypes: [float32, float16]                     # the sweep's dtype grid, for every entry that has one
shapes: [static, batch]                        # static, batch (dim 0 symbolic) or seq (dim 1 symbolic)
quant: [none, int8, int8-dynamic, int4]            # quantization schemes (docs/quantization.md)
threads: [1, 2]                                # intra-op threads (ONNX Runtime, ExecuTorch's threadpool)
```

Every axis but ``flows`` is optional. Each combination of flow, shapes, quant and threads is
one backend spec (``executorch-xnnpack:dynamic=batch,quant=int8``); dtypes select the records.
So the matrix is the support matrix with more backend columns: one row per op x configuration.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..dump.model import echo
from ..numerics.quantization import SCHEMES

SHAPES = {"static": None, "batch": "batch", "seq": "seq"}
QUANT = {"none": None, **{s: s for s in SCHEMES}}  # a flow that does not run a scheme is refused by its backend
KEYS = ("sweep", "flows", "dtypes", "shapes", "quant", "threads")
MAX_SPEC_BYTES = 1 << 16
# The configuration columns of the support matrix (``matrix.MATRIX_COLUMNS``).
CONFIG_COLUMNS = ("flow", "dtype", "shapes", "quant", "threads")


class MatrixSpecError(ValueError):
    """The matrix file cannot be used as written; the message names the file and the key."""


@dataclass
class ConfigMatrix:
    name: str
    flows: list[str]
    sweep: str | None = None
    dtypes: list[str] = field(default_factory=list)  # empty: the sweep's own
    shapes: list[str] = field(default_factory=lambda: ["static"])
    quant: list[str] = field(default_factory=lambda: ["none"])
    threads: list[int | None] = field(default_factory=lambda: [None])

    def specs(self) -> list[str]:
        """One backend spec per combination, flows outermost."""
        out = []
        for flow, shape, quant, threads in itertools.product(self.flows, self.shapes, self.quant, self.threads):
            extra = [f"dynamic={SHAPES[shape]}"] if SHAPES[shape] else []
            extra += [f"quant={QUANT[quant]}"] if QUANT[quant] else []
            extra += [f"threads={threads}"] if threads is not None else []
            if not extra:
                out.append(flow)
            else:
                out.append(flow + ("," if ":" in flow else ":") + ",".join(extra))
        return out


def load_matrix(path: str | Path) -> ConfigMatrix:
    """Read and check a matrix file; every spec it makes is checked against the backends' options."""
    from ..backends.registry import UnknownBackendError, parse_spec
    from .sweep_values import read_yaml_file

    name = str(path)
    data = read_yaml_file(path, "matrix", "matrix file", MatrixSpecError, MAX_SPEC_BYTES)
    if not isinstance(data, dict):
        raise MatrixSpecError(f"{name}: expected a mapping with keys {', '.join(KEYS)}")
    unknown = [k for k in data if k not in KEYS]
    if unknown:
        raise MatrixSpecError(f"{name}: unknown key {echo(unknown[0])} (keys: {', '.join(KEYS)})")
    if not data.get("flows"):
        raise MatrixSpecError(f"{name}: 'flows' lists the backend presets to run, e.g. [onnxrt-cpu, executorch-xnnpack]")
    m = ConfigMatrix(name, _strings(data, "flows", name))
    m.sweep = data.get("sweep") if isinstance(data.get("sweep"), str) else None
    if "sweep" in data and m.sweep is None:
        raise MatrixSpecError(f"{name}: 'sweep' names one sweep spec (a file or 'common')")
    if "dtypes" in data:
        m.dtypes = _strings(data, "dtypes", name)
    for key, known in (("shapes", SHAPES), ("quant", QUANT)):
        if key in data:
            values = _strings(data, key, name)
            bad = [v for v in values if v not in known]
            if bad:
                raise MatrixSpecError(f"{name}: {key}: {echo(bad[0])} is not one of {', '.join(known)}")
            setattr(m, key, values)
    if "threads" in data:
        values = data["threads"] if isinstance(data["threads"], list) else [data["threads"]]
        if not values or any(type(v) is not int or v < 1 for v in values):
            raise MatrixSpecError(f"{name}: threads: a list of positive integers, got {echo(data['threads'])}")
        m.threads = values
    for spec in m.specs():
        try:
            parse_spec(spec)
        except UnknownBackendError as e:
            raise MatrixSpecError(f"{name}: {e}") from None
    return m


def _strings(data: dict, key: str, name: str) -> list[str]:
    v = data[key]
    values = v if isinstance(v, list) else [v]
    if not values or not all(isinstance(x, str) and x for x in values):
        raise MatrixSpecError(f"{name}: {key}: a list of names, got {echo(v)}")
    return list(dict.fromkeys(values))


def config_of(spec: str, dtype: str) -> dict[str, Any]:
    """A backend spec and a record's dtype as the matrix's configuration columns (the matrix's
    own options in theirs, any other option in ``flow``)."""
    from ..backends.registry import PRESETS, parse_spec
    from ..backends.shapes import DIMS

    name, overrides = parse_spec(spec)
    options = {**PRESETS[name].options, **overrides}
    own = {"quant", "threads"} | ({"dynamic"} if options.get("dynamic") in DIMS else set())
    flow = ",".join([name, *(f"{k}={v}" for k, v in overrides.items() if k not in own)])
    return {"flow": flow, "dtype": dtype, "shapes": options.get("dynamic") if "dynamic" in own else "static",
            "quant": options.get("quant") or "none", "threads": options.get("threads", "")}
