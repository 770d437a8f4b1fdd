"""The two examples of the torch.compile correctness write-up, checked with compile-check on this
torch: a numerical one (ReflectionPad3d, view, chunk, PairwiseDistance: is inductor within fp32
precision?) and a crash (``torch.frexp`` under inductor on CPU: does it still fail to compile?).

    python -m xray.compiled.writeup --out xray-writeup
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn


class PadDistance(nn.Module):
    """ReflectionPad3d, view, chunk, PairwiseDistance: the numerical example."""

    def __init__(self) -> None:
        super().__init__()
        self.pad, self.dist = nn.ReflectionPad3d(1), nn.PairwiseDistance()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.pad(x).view(x.shape[0], -1).chunk(2, dim=1)
        return self.dist(a, b)


class Frexp(nn.Module):
    """``torch.frexp``: the crash example."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.frexp(x)


def pad_distance() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    return PadDistance(), (torch.randn(4, 3, 8, 8, 8),)


def frexp() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    return Frexp(), (torch.randn(64) * 100,)


def fp64_check(model: nn.Module, args: tuple, compiled: list[torch.Tensor]) -> dict[str, Any]:
    """torch._dynamo.utils.same against an fp64 run: the compiled outputs' RMSE to fp64 may not
    exceed the eager fp32 outputs' by more than its multiplier (2 or 3, by size); the RMSEs are
    reported beside its answer."""
    from torch._dynamo.utils import rmse, same

    from ..record.flatten import flatten_tensors

    with torch.no_grad():
        eager = flatten_tensors(model(*args))
        high = flatten_tensors(copy.deepcopy(model).double()(
            *[a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]))
    floats = [i for i, t in enumerate(eager) if t.is_floating_point()]
    errors = [(rmse(high[i], eager[i]).item(), rmse(high[i], compiled[i]).item()) for i in floats]
    ref, res = max(e for e, _ in errors), max(c for _, c in errors)
    return {"within_fp32": bool(same(eager, compiled, high, log_error=lambda *a, **k: None)),
            "eager_rmse_vs_fp64": ref, "compiled_rmse_vs_fp64": res, "ratio": res / ref if ref else None}


def run(out: Path, progress: Any = None) -> dict[str, Any]:
    """Both examples, each through compile_check into ``out/<name>``; the facts as one dict."""
    from .check import compile_check

    facts: dict[str, Any] = {"torch": torch.__version__}
    model, args = pad_distance()
    r = compile_check(model, args, out=out / "pad_distance", progress=progress)
    facts["pad_distance"] = {"verdict": r.verdict, "failed": r.summary.get("failed"),
                             **(fp64_check(model, args, r.outputs) if r.crash is None else {})}
    model, args = frexp()
    r = compile_check(model, args, out=out / "frexp", progress=progress)
    facts["frexp"] = {"verdict": r.verdict if r.crash else "consistent: compiles and runs where eager runs",
                      "crash": r.crash.to_json() if r.crash else None,
                      "bitwise_equal": None if r.crash else all(
                          torch.equal(a, b) for a, b in zip(r.outputs, list(model(*args))))}
    return facts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m xray.compiled.writeup", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="xray-writeup", help="output folder (default: xray-writeup)")
    a = p.parse_args(argv)
    from ..dump.folder_owner import OutputFolderError
    from .check import CompileCheckError

    try:
        facts = run(Path(a.out), progress=lambda s: print(f"writeup: {s}", file=sys.stderr, flush=True))
    except (CompileCheckError, OutputFolderError) as e:
        print(f"writeup: {e}", file=sys.stderr)
        return 2
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "writeup.json").write_text(json.dumps(facts, indent=2) + "\n")
    print(json.dumps(facts, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
