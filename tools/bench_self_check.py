"""What a self-check costs beside the op it checks (xray/record/self_check.py), per call.

Each checked op runs at the reference model's size (hidden 256, 2x128 tokens) and at a real size
(hidden 1024, 512 tokens; a ResNet stage's batch norm at 8x64x56x56), and its check on the same
arguments, interleaved: the median of ``--repeats`` timings each. Outside a recording: inside
one, each torch call the check makes also pays the dispatch machinery (docs/performance.md,
"Self-checks").

    python tools/bench_self_check.py [--repeats 30] [--threads 2]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from tabulate import tabulate

from xray.record.self_check import self_checks

aten = torch.ops.aten


def _median_us(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def _calls(tokens: int, hidden: int):
    """(label, op name, the op as a thunk, its bound arguments) at one size."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, hidden, generator=gen)
    w = torch.randn(hidden, hidden, generator=gen)
    g = torch.randn(tokens, hidden, generator=gen)
    v = torch.randn(hidden, generator=gen)
    q = torch.randn(1, hidden // 64, tokens, 64, generator=gen)
    calls = [("mm", "aten.mm.default", lambda: aten.mm.default(x, w), dict(self=x, mat2=w)),
             ("mean over the last dimension", "aten.mean.dim", lambda: aten.mean.dim(x, [-1], True),
              dict(self=x, dim=[-1], keepdim=True)),
             ("layer norm", "aten.native_layer_norm.default",
              lambda: aten.native_layer_norm.default(x, [hidden], v, v, 1e-5),
              dict(input=x, normalized_shape=[hidden], weight=v, bias=v, eps=1e-5))]
    _, mean, rstd = aten.native_layer_norm.default(x, [hidden], v, v, 1e-5)
    calls.append(("layer norm backward", "aten.native_layer_norm_backward.default",
                  lambda: aten.native_layer_norm_backward.default(g, x, [hidden], mean, rstd, v, v, [True] * 3),
                  dict(grad_out=g, input=x, normalized_shape=[hidden], mean=mean, rstd=rstd, weight=v, bias=v)))
    calls.append(("fused attention", "aten._scaled_dot_product_flash_attention_for_cpu.default",
                  lambda: aten._scaled_dot_product_flash_attention_for_cpu.default(q, q, q, 0.0, True),
                  dict(query=q, key=q, value=q, dropout_p=0.0, is_causal=True)))
    return calls


def _batch_norm(shape: tuple[int, ...]):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    w = torch.randn(shape[1])
    return ("batch norm, training", "aten.native_batch_norm.default",
            lambda: aten.native_batch_norm.default(x, w, w, None, None, True, 0.1, 1e-5),
            dict(input=x, weight=w, bias=w, running_mean=None, running_var=None, training=True, eps=1e-5))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for size, calls in (("2x128 x 256", _calls(256, 256) + [_batch_norm((8, 16, 28, 28))]),
                        ("512 x 1024", _calls(512, 1024) + [_batch_norm((8, 64, 56, 56))])):
        for label, name, op, bound in calls:
            outs = op()
            outs = list(outs) if isinstance(outs, tuple) else [outs]
            checked = self_checks(name, bound, outs)
            if not checked:
                raise SystemExit(f"{label}: no self-check taken")
            op_us = _median_us(op, args.repeats)
            check_us = _median_us(lambda: self_checks(name, bound, outs), args.repeats)
            rows.append([size, label, len(checked), f"{op_us:,.0f}", f"{check_us:,.0f}", f"{check_us / op_us:.2f}x"])
    print(tabulate(rows, headers=["size", "op", "outputs checked", "op (us)", "its check (us)", "check / op"]))


if __name__ == "__main__":
    main()
