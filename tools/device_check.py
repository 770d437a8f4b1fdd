"""A prepared check for a machine with an accelerator: record, compare, generate, report as JSON.

Run from the repository root on the device machine (a few minutes on an H100):

    python tools/device_check.py --device cuda --out /tmp/device_check --json $OUT/device_check.json

1. makes this checkout's xray importable (``--pip`` installs it with pip instead);
2. records, per architecture (transformers configs, random weights, tools/accuracy/archs.py), a
   CPU fp32 bench and device targets: fp32 (TF32 off), TF32, bf16 and fp16 autocast, and one
   injected fault per precision (a matmul-family call's output x (1 + eps): fp32 1e-3, TF32 1e-2,
   bf16 5e-2), laid out as tests/fixtures/cuda-h100 is (manifest.json with the ground truth);
3. scores compare on every target (tools/accuracy/devices.py: exact hit, clean legitimate runs);
4. generates the op-test suite from the CPU bench dump and runs it on the device, and the suite
   from a device dump and runs it on CPU;
5. writes every figure as JSON. ``--device cpu`` exercises the whole pipeline without a device.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import warnings
from contextlib import ExitStack, nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

ARCHS = ("llama-sdpa", "gpt2", "bert", "vit")
# variant -> (tf32, autocast dtype name, fault eps or None)
VARIANTS = {"cuda_fp32": (False, None, None), "cuda_tf32": (True, None, None), "cuda_bf16": (False, "bfloat16", None),
            "cuda_fp16": (False, "float16", None), "fault_fp32_1e-3": (False, None, 1e-3),
            "fault_tf32_1e-2": (True, None, 1e-2), "fault_bf16_5e-2": (False, "bfloat16", 5e-2)}
FAULT_CALL = 2  # the third call of the model's most frequent matmul op


def _importable(pip: bool) -> None:
    if pip:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e",
                        str(ROOT)], check=True)
    else:
        sys.path.insert(0, str(ROOT))
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))


def _record(folder: Path, model, inputs: dict, device: str, tf32: bool, autocast: str | None, modes=()) -> Path:
    import torch
    import xray

    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    model = model.to(device)
    inputs = {k: v.to(device) for k, v in inputs.items()}
    cast = torch.autocast(device, dtype=getattr(torch, autocast)) if autocast else nullcontext()
    with ExitStack() as stack:
        for m in modes:  # below the recorder: the corrupted value is recorded as the call's own
            stack.enter_context(m)
        xray.begin_dump(X_DEBUG=0x102, X_DEDUP=False, X_DUMP_NUM=4, dump_dir=folder)
        try:
            with torch.no_grad(), cast:
                model(**inputs)
        finally:
            path = xray.end_dump()
    torch.backends.cuda.matmul.allow_tf32 = False
    return Path(path)


def _matmul_op(bench: Path) -> str:
    import xray

    ops = [r.op for r in xray.load_dump(bench).records if r.op in ("aten.mm.default", "aten.addmm.default")]
    return max(set(ops), key=ops.count)


def record_all(out: Path, device: str, archs: list[str]) -> dict:
    from accuracy.archs import ARCHS as BUILD
    from accuracy.faults import CorruptCall, relative
    import xray

    dumps: dict[str, dict] = {}
    for arch in archs:
        a = BUILD[arch]
        bench = _record(out / arch / "cpu_fp32", a.build(), a.inputs(), "cpu", False, None)
        dumps[f"{arch}/cpu_fp32"] = {"arch": arch, "variant": "cpu_fp32", "device": "cpu",
                                     "path": str(bench.relative_to(out))}
        op = _matmul_op(bench)
        for variant, (tf32, autocast, eps) in VARIANTS.items():
            fault = CorruptCall(op, FAULT_CALL, relative(eps)) if eps else None
            path = _record(out / arch / variant, a.build(), a.inputs(), device, tf32, autocast,
                           [fault] if fault else [])
            entry = {"arch": arch, "variant": variant, "device": device, "path": str(path.relative_to(out)),
                     "tf32": tf32, "autocast": autocast}
            if fault is not None:
                calls = [r for r in xray.load_dump(path).records if r.op == op and r.direction == "forward"]
                if not fault.hit or len(calls) <= FAULT_CALL:
                    raise RuntimeError(f"{arch}/{variant}: the fault did not fire")
                entry.update(fault_eps=eps, fault_op=op, fault_target_seq=calls[FAULT_CALL].seq,
                             fault_module=calls[FAULT_CALL].module)
            dumps[f"{arch}/{variant}"] = entry
    (out / "manifest.json").write_text(json.dumps({"dumps": dumps}, indent=1))
    return dumps


def _suite(dump: Path, folder: Path, device: str) -> dict:
    """xray-gen on ``dump``, pytest on ``device``: counts from pytest's summary line."""
    gen = subprocess.run([sys.executable, "-m", "xray.gen.cli", str(dump), "-o", str(folder), "-q"],
                         capture_output=True, text=True)
    if gen.returncode:
        return {"error": gen.stderr.strip()[-500:]}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(folder), "--device", device,
                          "-rfs"], capture_output=True, text=True, cwd=folder)
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error)", run.stdout.splitlines()[-1])}
    failed = re.findall(r"^FAILED (\S+)", run.stdout, re.M)
    skipped = re.findall(r"^SKIPPED \[\d+\] (.*)$", run.stdout, re.M)
    return {"dump": str(dump), "device": device, **counts, "failed_tests": failed, "skip_reasons": skipped[:20]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, default=Path("/tmp/xray_device_check"))
    ap.add_argument("--json", type=Path, help="write the results here (default: <out>/device_check.json)")
    ap.add_argument("--archs", default=",".join(ARCHS), help=f"comma-separated, from tools/accuracy/archs.py ({','.join(ARCHS)})")
    ap.add_argument("--pip", action="store_true", help="pip install -e this checkout first (no dependencies)")
    args = ap.parse_args(argv)
    _importable(args.pip)
    warnings.simplefilter("ignore")
    import torch

    from accuracy import devices

    started = time.perf_counter()
    result: dict = {"device": args.device, "torch": torch.__version__, "cuda": torch.version.cuda,
                    "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") and torch.cuda.is_available()
                    else None}
    archs = [a for a in args.archs.split(",") if a]
    dumps = record_all(args.out, args.device, archs)
    result["record_seconds"] = round(time.perf_counter() - started, 1)
    outcomes = [devices.score(args.out, key, e) for key, e in dumps.items() if e["variant"] != "cpu_fp32"]
    result["compare"] = devices.totals(outcomes)
    result["runs"] = [o.__dict__ for o in outcomes]
    suites = []
    for arch in archs:
        suites.append(_suite(args.out / dumps[f"{arch}/cpu_fp32"]["path"], args.out / "gen" / arch / "cpu_dump",
                             args.device))
        suites.append(_suite(args.out / dumps[f"{arch}/cuda_bf16"]["path"], args.out / "gen" / arch / "device_dump",
                             "cpu"))
    result["generated_suites"] = suites
    result["seconds"] = round(time.perf_counter() - started, 1)
    path = args.json or args.out / "device_check.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=str))
    c = result["compare"]
    print(f"device check on {result['gpu'] or args.device}: exact hit {c['exact_pct']:.1f} % of {c['faults']} faults, "
          f"{c['legit_clean']}/{c['legitimate']} legitimate runs clean; suites: "
          + "; ".join(f"{Path(s.get('dump', '?')).parts[-3] if 'dump' in s else '?'} on {s.get('device')}: "
                      f"{s.get('passed', 0)} passed, {s.get('failed', 0)} failed, {s.get('skipped', 0)} skipped"
                      for s in suites)
          + f"; {result['seconds']} s -> {path}")
    return 0 if c["crashes"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
