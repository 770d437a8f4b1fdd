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

import torch  # noqa: E402

import xray  # noqa: E402
from xray.inject import FaultSpec, InjectFault  # noqa: E402
from xray.models import tiny_llama, token_batch  # noqa: E402

# The corrupted call of the demo's target run: the 6th matmul (call 5) is layer 0's MLP up_proj.
DEMO_FAULT = FaultSpec(op="aten.mm.default", call=5, scale=1.0, offset=0.05)


def _move(folder: Path, dest: Path) -> Path:
    if dest.exists():
        shutil.rmtree(dest)
    shutil.move(str(folder), dest)
    shutil.rmtree(folder.parent, ignore_errors=True)
    return dest


def record_pair(out: Path, *, layers: int = 1, hidden: int = 32, seq: int = 8, dump_num: int = 8,
                fault: FaultSpec = DEMO_FAULT) -> tuple[Path, Path, bool]:
    """Dump the bench run (fp32) and the target run (bf16 autocast + one injected fault)."""
    model = tiny_llama(layers=layers, hidden=hidden)
    ids = token_batch(batch=2, seq=seq, vocab=256)
    with torch.no_grad(), xray.dump(dump_dir=out / "_tmp_bench", X_DEDUP=False, X_DUMP_NUM=dump_num) as s:
        model(ids)
    bench = _move(s.folder, out / "llama-fp32")
    injector = InjectFault(fault)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), \
            xray.dump(dump_dir=out / "_tmp_target", X_DEDUP=False, X_DUMP_NUM=dump_num) as s:
        with injector:
            model(ids)
    target = _move(s.folder, out / "llama-bf16-fault")
    return bench, target, injector.hit


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="dumps")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(exist_ok=True)
    bench, target, hit = record_pair(out)
    assert hit, "the injected fault did not fire"
    model, ids = tiny_llama(layers=1, hidden=32), token_batch(batch=2, seq=8)
    with torch.no_grad(), xray.dump(dump_dir=out / "_tmp_dedup", X_DEDUP=True, X_DUMP_NUM=8) as s:
        model(ids)
    _move(s.folder, out / "llama-dedup")
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
