"""Benchmark xray-gen: generation rate (records/s) on a large synthetic dump.

Writes a dump.json in the documented format (docs/format.md) with N op records (default 100k)
over a few thousand distinct signatures, then times, side by side in one run: reading the dump
(xray.load_dump, not ours), planning (de-dup), and rendering the test files.

    python tools/bench_gen.py [--records 100000] [--distinct 2000]
"""
from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

import xray
from xray.gen.blacklist import Blacklist
from xray.gen.generator import generate, plan


def _tensor(shape: list[int], dtype: str = "float32") -> dict:
    stride, acc = [], 1
    for n in reversed(shape):
        stride.insert(0, acc)
        acc *= n
    return {"t": "tensor", "shape": shape, "dtype": dtype, "stride": stride, "device": "cpu",
            "stats": {"min": -1.5, "max": 2.0, "mean": 0.1, "std": 0.7, "nan": 0, "posinf": 0, "neginf": 0,
                      "numel": acc}}


def _record(seq: int, variant: int, rng: random.Random) -> dict:
    """One op call; ``variant`` picks the op and shape so there are ~`distinct` signatures."""
    n = 4 + variant // 7  # (kind, n) is unique per variant
    kind = variant % 7
    if kind == 0:
        op, inputs = "aten.add.Tensor", {"self": _tensor([2, n]), "other": _tensor([2, n]), "alpha": 1}
    elif kind == 1:
        op, inputs = "aten.mm.default", {"self": _tensor([n, 8]), "mat2": _tensor([8, 16])}
    elif kind == 2:
        op, inputs = "aten.cat.default", {"tensors": [_tensor([2, n]), _tensor([3, n])], "dim": 0}
    elif kind == 3:
        op, inputs = "aten._softmax.default", {"self": _tensor([4, n], "bfloat16"), "dim": -1, "half_to_float": False}
    elif kind == 4:
        op, inputs = "aten.mul_.Tensor", {"self": _tensor([n]), "other": _tensor([n])}
    elif kind == 5:
        op, inputs = "aten.max.dim", {"self": _tensor([3, n]), "dim": 1, "keepdim": variant % 2 == 0}
    else:
        op, inputs = "aten.view.default", {"self": _tensor([2, n]), "size": [n, 2]}
    inputs = {k: v for k, v in inputs.items()}
    return {"seq": seq, "kind": "op", "op": op, "direction": "forward", "module": f"model.layers.{variant % 24}.mlp",
            "inputs": inputs, "outputs": [_tensor([2, n])], "count": 1, "first_seq": seq, "last_seq": seq}


def write_synthetic(folder: Path, records: int, distinct: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    recs = [_record(i, rng.randrange(distinct), rng) for i in range(records)]
    head = {"format": "xray-trace", "format_version": 1, "created": "bench", "torch_version": "synthetic",
            "pid": 0, "rank": None, "config": {}, "complete": True,
            "summary": {"op_calls": records, "records": records}, "records": recs}
    (folder / "dump.json").write_text(json.dumps(head, separators=(",", ":")))
    return folder


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=100_000)
    p.add_argument("--distinct", type=int, default=2000)
    p.add_argument("--json", type=Path, help="also write the headline numbers here (for tools/bench.py)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_synthetic(Path(tmp) / "dump", args.records, args.distinct)
        size_mb = (folder / "dump.json").stat().st_size / 2**20
        t0 = time.perf_counter()
        dump = xray.load_dump(folder)
        t1 = time.perf_counter()
        cases, _ = plan(dump.records, Blacklist.load())
        t2 = time.perf_counter()
        report = generate(dump, Path(tmp) / "pytests", factory="random")
        t3 = time.perf_counter()
    n = len(dump.records)
    load_s, plan_s, gen_s = t1 - t0, t2 - t1, t3 - t2
    rows = [
        ["read dump.json (xray.load_dump)", f"{load_s:.2f}", f"{n / load_s:,.0f}"],
        ["de-dup only (plan)", f"{plan_s:.2f}", f"{n / plan_s:,.0f}"],
        ["generate (plan + render + write)", f"{gen_s:.2f}", f"{n / gen_s:,.0f}"],
        ["end to end (read + generate)", f"{load_s + gen_s:.2f}", f"{n / (load_s + gen_s):,.0f}"],
    ]
    print(f"synthetic dump: {n:,} records, {size_mb:.1f} MiB dump.json; "
          f"{report.tests} tests in {report.files} files ({report.skipped.get('blacklisted', 0):,} blacklisted records)")
    print(tabulate(rows, headers=["stage", "seconds", "records/s"], tablefmt="github"))
    print(f"ratio generate / read: {gen_s / load_s:.2f}x; render share of generate: {(gen_s - plan_s) / gen_s:.0%}")
    if args.json:
        args.json.write_text(json.dumps({"records": n, "tests": report.tests, "gen_records_per_s": n / gen_s,
                                         "read_records_per_s": n / load_s, "gen_vs_read": gen_s / load_s}))


if __name__ == "__main__":
    main()
