"""Does a device's half-precision matmul add split-K partials in half precision, and how much
does that cost? The measurement behind ``noise_floor.SPLIT_K_MIN_TERMS``.

For each shape (small M x N with a long K is where cuBLAS splits K), the bf16 and fp16 product
is run with ``allow_{bf16,fp16}_reduced_precision_reduction`` off and on, and its error against
the float64 product of the same (already rounded) inputs is printed: the RMS relative error
and the largest element error relative to the output's RMS, beside the bound compare allows for
the reduction (``Floors.accumulation`` with and without reduced reductions), and the error of
rounding the exact product once to the output dtype (what a CPU kernel makes).

    python tools/probe_split_k.py --device cuda
"""
from __future__ import annotations

import argparse
import sys

import torch
from tabulate import tabulate

from xray.compare.noise_floor import Floors
from xray.numerics.math_settings import RunMath

SHAPES = [(64, 64, 32), (64, 64, 256), (64, 64, 1024), (64, 64, 4096), (32, 32, 16384), (16, 16, 65536),
          (2048, 1024, 1024), (2048, 2816, 1024), (2048, 1024, 2816), (128, 128, 8192)]


def _errors(out: torch.Tensor, exact: torch.Tensor) -> tuple[float, float]:
    scale = exact.square().mean().sqrt().clamp_min(1e-30)
    diff = out.double() - exact
    return float(diff.square().mean().sqrt() / scale), float(diff.abs().max() / scale)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    matmul = torch.backends.cuda.matmul
    rows = []
    g = torch.Generator(device="cpu").manual_seed(0)
    for dtype, switch in ((torch.bfloat16, "allow_bf16_reduced_precision_reduction"),
                          (torch.float16, "allow_fp16_reduced_precision_reduction")):
        before = getattr(matmul, switch)
        try:
            for m, n, k in SHAPES if device.type != "cpu" else SHAPES[:3]:  # a CPU: a smoke run
                a = torch.randn(m, k, generator=g).to(dtype).to(device)
                b = torch.randn(k, n, generator=g).to(dtype).to(device)
                exact = a.double() @ b.double()
                rounded = _errors(exact.to(dtype), exact)
                found = {}
                for on in (False, True):
                    setattr(matmul, switch, on)
                    found[on] = _errors(a @ b, exact)
                allowed = {on: Floors(rules=None, math=RunMath(device=device.type, reduced_reduction=on)
                                      ).accumulation(dtype, k) for on in (False, True)}
                rows.append([str(dtype).removeprefix("torch."), f"{m}x{n}x{k}", f"{rounded[0]:.2e}",
                             f"{found[False][0]:.2e}", f"{found[False][1]:.2e}",
                             f"{found[True][0]:.2e}", f"{found[True][1]:.2e}",
                             f"{allowed[False]:.2e}", f"{allowed[True]:.2e}"])
        finally:
            setattr(matmul, switch, before)
    print(f"{torch.cuda.get_device_name() if device.type == 'cuda' else device} ({torch.__version__}): "
          "error of A @ B against the float64 product, relative to the output's RMS")
    print(tabulate(rows, headers=["dtype", "MxNxK", "rounding once (rms)", "reduced off: rms", "max",
                                  "reduced on: rms", "max", "accumulation bound off", "on"], tablefmt="github"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
