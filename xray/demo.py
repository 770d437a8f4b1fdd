"""``xray demo``: the whole workflow on a real transformers model built from a small config."""
from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def _say(step: str) -> None:
    print(f"\n== {step}", flush=True)


def run_demo(out: Path, *, small: bool = False, replay: bool = True) -> int:
    import torch

    import xray
    from xray.cli import info_text
    from xray.models import tiny_llama, token_batch

    started = time.perf_counter()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    layers, hidden, seq = (1, 32, 8) if small else (2, 64, 32)
    model = tiny_llama(layers=layers, hidden=hidden)
    ids = token_batch(batch=2, seq=seq, vocab=256)

    _say(f"1/1 dump a {layers}-layer Llama (hidden {hidden}) on CPU fp32")
    with torch.no_grad(), xray.dump(dump_dir=out / "bench", X_DEDUP=False, X_DUMP_NUM=8) as session:
        model(ids)
    bench = xray.load_dump(session.folder)
    print(info_text(bench, top=10))
    print(f"\ndone in {time.perf_counter() - started:.1f} s; dump: {session.folder}")
    return 0


if __name__ == "__main__":
    sys.exit(run_demo(Path(sys.argv[1] if len(sys.argv) > 1 else "xray-demo")))
