"""Regenerate the small example dumps in dumps/ (a real Llama, random weights, fixed seeds).

    python tools/make_example_dumps.py [--out dumps]

- ``llama-fp32/``: the trusted run, CPU fp32, every call recorded (X_DEDUP=0) with tensors.
- ``llama-bf16-fault/``: a "target device" run: bf16 autocast plus one corrupted matmul.
- ``llama-dedup/``: the same model de-duplicated (the generator's typical input).
- ``llama-module.h5``: a PrecisionDebugger module-level dump (forward and backward).
Each stays well under a few MB.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


import xray  # noqa: E402
from xray.demo.examples import record_dedup, record_pair  # noqa: E402
from xray.demo.models import tiny_llama, token_batch  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="dumps")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(exist_ok=True)
    bench, target, hit = record_pair(out)
    assert hit, "the injected fault did not fire"
    record_dedup(out / "llama-dedup")
    model, ids = tiny_llama(layers=1, hidden=32), token_batch(batch=2, seq=8)
    module_h5 = out / "llama-module.h5"
    try:
        debugger = xray.PrecisionDebugger(dump_path=str(out / "_tmp_module"), hook_name="dump", model=model.train())
        debugger.start()
        model(ids, labels=ids).loss.backward()
        debugger.stop()
        produced = sorted((out / "_tmp_module").rglob("*.h5"))
        shutil.copy(produced[0], module_h5)
    finally:
        shutil.rmtree(out / "_tmp_module", ignore_errors=True)
    for p in sorted(out.iterdir()):
        size = sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else p.stat().st_size
        print(f"{p}: {size / 2**20:.2f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
