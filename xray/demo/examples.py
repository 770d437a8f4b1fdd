"""Recording the example runs shared by ``xray demo``, ``tools/make_example_dumps.py`` and tests:
a trusted CPU fp32 run and a "target device" run (bf16 autocast plus one broken kernel call)."""
from __future__ import annotations

import shutil
from pathlib import Path

import torch

import xray
from xray.demo.inject import FaultSpec, InjectFault
from xray.demo.models import tiny_llama, token_batch

# The corrupted call of the demo's target run: the 6th matmul (call 5) is layer 0's MLP up_proj.
DEMO_FAULT = FaultSpec(op="aten.mm.default", call=5, scale=1.0, offset=0.05)


def move_dump(folder: Path, dest: Path) -> Path:
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
    bench = move_dump(s.folder, out / "llama-fp32")
    # The injector goes *below* the tracer (entered first): the tracer then records the faulty
    # output as the op's own result, exactly like a broken kernel on a real device.
    injector = InjectFault(fault)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), injector, \
            xray.dump(dump_dir=out / "_tmp_target", X_DEDUP=False, X_DUMP_NUM=dump_num) as s:
        model(ids)
    target = move_dump(s.folder, out / "llama-bf16-fault")
    return bench, target, injector.hit


def record_dedup(dest: Path, *, layers: int = 1, hidden: int = 32, seq: int = 8, dump_num: int = 8) -> Path:
    """A de-duplicated dump of the same model (what the generator and replay usually read)."""
    model, ids = tiny_llama(layers=layers, hidden=hidden), token_batch(batch=2, seq=seq, vocab=256)
    with torch.no_grad(), xray.dump(dump_dir=dest.parent / "_tmp_dedup", X_DEDUP=True, X_DUMP_NUM=dump_num) as s:
        model(ids)
    return move_dump(s.folder, dest)
