"""One prepared check for a machine with an accelerator (issue 30), in under 5 minutes.

For each architecture (llama, gpt2, bert, vit; tiny transformers configs with random weights, as
/work/shared/fixtures/README.md describes; and resnet, whose batch norms run cudnn's kernel on
CUDA, and llama-train, a forward, backward and AdamW step whose attention gradients come from
CUDA's own backward kernels and whose update from its multi-tensor ``_foreach_*`` kernels) it
records one forward (and backward), every call, statistics and 4 saved
tensors per call (``X_DEBUG=0x102``, 0x10A with backward, no de-dup, ``X_DUMP_NUM=4``), as:

- ``cpu_fp32``: the bench, on the CPU;
- ``dev_fp32``, ``dev_tf32``, ``dev_bf16``, ``dev_fp16``: the device in fp32, with TF32 on, and
  under bf16 / fp16 autocast. Legitimate: the right verdict is no FAIL or NaN/Inf row and no first
  divergence;
- ``defaults_tf32``, ``defaults_bf16``: the TF32 and bf16 runs again, both sides recorded with the
  recorder's defaults (de-dup, ``X_DUMP_NUM=5``), as most users record: legitimate too;
- ``fault_*``: one matmul-family (resnet: or convolution) call's output multiplied by 1+eps by a dispatch mode entered
  *below* the recorder, so the recorder sees the corrupted value as that call's own output. The
  right verdict names that call (its seq, read from the dump: the n-th matmul-family record).

Each device run is compared with the bench and scored by tools/accuracy/devices.py, the scorer of
the fixtures' set (a run that fails to record or compare counts as wrong). Then op suites
are generated from each CPU dump and run with ``pytest --device DEV``, and
``tools/bench_record.py --device DEV`` measures the recording cost (printed at the end: the
ratio to eager, added kernel launches per recorded call and host syncs between flushes per
configuration, and the statistics alone with the fused Triton kernel beside the per-tensor
fallback). Everything is written as
JSON under ``--out`` (``check.json`` holds the whole summary). ``--device cpu`` runs the same
script end to end on any machine (tests/test_device_check.py).

    pip install --no-deps --no-build-isolation -e .   # once, on the device machine
    python tools/device_check.py --device cuda --out device-check/
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from xml.etree import ElementTree

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import xray  # noqa: E402
from xray.gen.generator import generate  # noqa: E402
from xray.numerics import math_settings  # noqa: E402
from xray.record.config import DumpConfig  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from accuracy import archs, devices  # noqa: E402 -- the fixtures' scorer, so both count alike

ARCHS = ("llama", "gpt2", "bert", "vit", "resnet", "lstm", "llama-train")
MATMULS = frozenset({"aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.baddbmm.default",
                     "aten.matmul.default", "aten.linear.default"})
RNN_KERNELS = frozenset({"aten._cudnn_rnn.default", "aten.miopen_rnn.default", "aten.mkldnn_rnn_layer.default"})
FAULT_OPS = {"resnet": MATMULS | {"aten.convolution.default"}, "lstm": MATMULS | RNN_KERNELS}  # else MATMULS
# variant -> (TF32 on, autocast dtype or None, fault eps or None)
VARIANTS = {
    "dev_fp32": (False, None, None),
    "dev_tf32": (True, None, None),
    "dev_bf16": (False, torch.bfloat16, None),
    "dev_fp16": (False, torch.float16, None),
    "fault_fp32_1e-3": (False, None, 1e-3),
    "fault_tf32_1e-2": (True, None, 1e-2),
    "fault_bf16_5e-2": (False, torch.bfloat16, 5e-2),
}
# the same runs recorded with the recorder's defaults (X_DEDUP=True, X_DUMP_NUM=5), as most users
# record, against a CPU bench recorded the same way: variant -> the run it repeats
DEFAULTS = {"defaults_tf32": "dev_tf32", "defaults_bf16": "dev_bf16"}
FAULT_N = {"lstm": 0}  # the (n+1)-th matmul-family call is corrupted: the RNN kernel; else the third


def build(arch: str):
    """(model, inputs) of one tiny architecture: hidden 32, 2 layers, 12 tokens or one 32x32 image."""
    import transformers as tf

    torch.manual_seed(0)
    common = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    if arch == "lstm":  # a 2-layer LSTM language model: CUDA runs it as one _cudnn_rnn (TF32 by cudnn's default)
        return archs.ARCHS["lstm-lm"].build(), archs.ARCHS["lstm-lm"].inputs()
    if arch == "resnet":
        model = tf.ResNetForImageClassification(tf.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32],
                                                                depths=[1, 1], layer_type="basic", num_labels=10))
        return archs.calibrated(model, seed=1), {"pixel_values": torch.randn(1, 3, 32, 32)}
    if arch in ("llama", "llama-train"):
        model = tf.LlamaForCausalLM(tf.LlamaConfig(vocab_size=256, num_key_value_heads=2, **common))
    elif arch == "gpt2":
        model = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=256, n_embd=32, n_layer=2, n_head=4, n_positions=64))
    elif arch == "bert":
        model = tf.BertModel(tf.BertConfig(vocab_size=256, **common))
    elif arch == "vit":
        model = tf.ViTForImageClassification(tf.ViTConfig(image_size=32, patch_size=8, num_labels=10, **common))
        return model.eval(), {"pixel_values": torch.randn(1, 3, 32, 32)}
    else:
        raise ValueError(f"unknown architecture {arch!r}")
    return model.eval(), {"input_ids": torch.randint(0, 256, (1, 12))}


class Fault(TorchDispatchMode):
    """Multiplies the output of the (n+1)-th call of ``ops`` by 1+eps."""

    def __init__(self, n: int, eps: float, ops: frozenset[str] = MATMULS) -> None:
        super().__init__()
        self.n, self.eps, self.ops, self.seen, self.op = n, eps, ops, 0, None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = f"aten.{func._schema.name.split('::')[-1]}.{func._overloadname}"
        if name in self.ops:
            if self.seen == self.n:  # an RNN kernel returns (output, h_n, c_n, ...): its output is corrupted
                out = (out[0] * (1 + self.eps), *out[1:]) if isinstance(out, (tuple, list)) else out * (1 + self.eps)
                self.op = name
            self.seen += 1
        return out


def record(arch: str, device: str, variant: str, out: Path) -> dict:
    """Record one run; returns its manifest entry (path, and for a fault the corrupted seq)."""
    defaults = variant in DEFAULTS or variant == "cpu_fp32_defaults"
    tf32, autocast, eps = VARIANTS.get(DEFAULTS.get(variant, variant), (False, None, None))
    model, inputs = build(arch)
    model = model.to(device)
    inputs = {k: v.to(device) for k, v in inputs.items()}
    ops = FAULT_OPS.get(arch, MATMULS)
    n = FAULT_N.get(arch, 2)
    fault = Fault(n, eps, ops) if eps else None
    train = arch.endswith("-train")
    amp = torch.autocast(torch.device(device).type, dtype=autocast) if autocast else contextlib.nullcontext()
    with torch.enable_grad() if train else torch.no_grad(), math_settings.tf32(tf32):
        with fault if fault else contextlib.nullcontext():  # entered first: below the recorder
            with xray.dump(dump_dir=out / arch / variant, X_DEBUG=0x10A if train else 0x102,
                           X_DEDUP=DumpConfig.dedup if defaults else False,
                           X_DUMP_NUM=DumpConfig.dump_num if defaults else 4) as d:
                with amp:
                    output = model(**inputs)[0]
                if train:  # the backward outside autocast, as a training step runs it, then one AdamW
                    output.float().square().mean().backward()  # step as _foreach_* kernels (CUDA's default)
                    torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, foreach=True).step()
    entry = {"arch": arch, "variant": variant, "device": device, "path": str(d.folder), "tf32": tf32,
             "autocast": str(autocast)}
    if fault:
        dump = xray.load_dump(d.folder)
        matmuls = [r for r in dump.records if r.kind == "op" and r.op in ops]
        target = matmuls[n]
        entry.update(fault_eps=eps, fault_n=n, fault_target_seq=target.seq, fault_op=target.op,
                     fault_module=target.module, injected_op=fault.op)
        dump.close()
    return entry


def score(bench: dict, target: dict) -> dict:
    """The verdict on one device run, scored by the fixtures' own scorer (tools/accuracy/devices.py):
    a fault run is right when its first divergence (or that divergence's culprit) is the corrupted
    call; a legitimate run when no row is FAIL or NaN/Inf and nothing diverges; a crash never."""
    o = devices.judge(bench["path"], target["path"], target)
    return {"run": o.key, "counts": o.counts, "first_divergence": o.first_divergence, "fail_rows": o.fail_rows,
            "right": o.right, "right_module": o.right_module, "seconds": round(o.seconds, 3),
            **({"error": o.crash[:500]} if o.crash else {})}


def run_suite(bench: dict, device: str, out: Path, timeout: float) -> dict:
    """Generate the op suite of a CPU dump and run it with pytest --device DEV."""
    suite = out / "suites" / bench["arch"]
    dump = xray.load_dump(bench["path"])
    report = generate(dump, suite)
    dump.close()
    junit = suite / "junit.xml"
    cmd = [sys.executable, "-m", "pytest", str(suite), "-q", "-p", "no:cacheprovider", "--device", device,
           "--detail_compare_path", str(suite / "result.csv"), f"--junitxml={junit}"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=suite)
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or [""]
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        tail, rc = ["timed out"], None
    return {"arch": bench["arch"], "files": report.files, "tests": report.tests, "pytest_rc": rc, "summary": tail[0],
            **junit_counts(junit)}


def junit_counts(path: Path) -> dict:
    """passed/failed/skipped/errors from pytest's JUnit XML: the console's last line depends on the
    caller's options (durations, warnings, xdist), the XML does not."""
    if not path.is_file():
        return {}
    suites = ElementTree.parse(path).getroot()
    suites = [suites] if suites.tag == "testsuite" else list(suites.iter("testsuite"))
    total = {key: sum(int(s.get(key, 0)) for s in suites) for key in ("tests", "failures", "errors", "skipped")}
    return {"passed": total["tests"] - total["failures"] - total["errors"] - total["skipped"],
            "failed": total["failures"], "errors": total["errors"], "skipped": total["skipped"]}


def run_bench(device: str, out: Path, repeats: int, timeout: float) -> dict:
    tool = Path(__file__).with_name("bench_record.py")
    path = out / "bench_record.json"
    cmd = [sys.executable, str(tool), "--device", device, "--repeats", str(repeats), "--json", str(path)]
    if device == "cpu":
        cmd.append("--small")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if proc.returncode != 0 or not path.exists():
        return {"error": (proc.stderr or proc.stdout)[-2000:]}
    return json.loads(path.read_text())


def bench_summary(bench: dict) -> list[str]:
    """The recording-cost lines issue 30's targets are read from: per recorded configuration, the
    ratio to eager, added kernel launches per recorded call and host syncs between flushes; then
    the statistics alone, per batch kernel (fused Triton vs the per-tensor fallback)."""
    if "error" in bench:
        return [f"  bench_record failed: {bench['error'][-300:]}"]
    lines = []
    for r in bench.get("rows", []):
        if "added_per_call" in r:
            syncs = r.get("syncs_between_flushes")
            lines.append(f"  {r['dtype']} {r['config']}: {r['ratio']:.2f}x eager, "
                         f"{r['added_per_call']:.3f} added launches per recorded call, "
                         f"host syncs between flushes {'n/a' if syncs is None else syncs}")
    for c in bench.get("stats_cost", []):
        lines.append(f"  {c['dtype']} statistics of {c['tensors']} outputs ({c['gbytes']} GB), {c['kernel']}: "
                     f"{c['ms']:.2f} ms, {c['launches']} launches")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", required=True, help="cuda, xpu, mps, cpu...")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--archs", default=",".join(ARCHS))
    ap.add_argument("--variants", default=",".join([*VARIANTS, *DEFAULTS]))
    ap.add_argument("--bench-repeats", type=int, default=3, help="0: skip tools/bench_record.py")
    ap.add_argument("--suite-timeout", type=float, default=60.0)
    ap.add_argument("--bench-timeout", type=float, default=150.0)
    args = ap.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    check: dict = {"device": args.device, "torch": torch.__version__, "runs": [], "scores": [], "suites": []}
    if args.device.startswith("cuda") and torch.cuda.is_available():
        check["gpu"] = torch.cuda.get_device_name()

    def save() -> None:  # after every step: a crash or a timeout keeps what was done
        check["seconds"] = round(time.perf_counter() - started, 1)
        (out / "check.json").write_text(json.dumps(check, indent=1, default=str))

    for arch in args.archs.split(","):
        bench = record(arch, "cpu", "cpu_fp32", out)
        check["runs"].append(bench)
        benches = {False: bench}
        for variant in args.variants.split(","):
            if arch == "lstm" and args.device == "cpu" and VARIANTS.get(variant, (0, None))[1] == torch.float16:
                continue  # oneDNN has no float16 LSTM for CPU (torch raises); CUDA's cuDNN has
            try:
                defaults = variant in DEFAULTS
                if defaults not in benches:
                    benches[defaults] = record(arch, "cpu", "cpu_fp32_defaults", out)
                    check["runs"].append(benches[defaults])
                target = record(arch, args.device, variant, out)
                check["runs"].append(target)
                check["scores"].append(score(benches[defaults], target))
            except Exception as e:  # noqa: BLE001 - one failing run must not lose the others
                check["scores"].append({"run": f"{arch}/{variant}", "error": f"{type(e).__name__}: {e}"[:500]})
            save()
        check["suites"].append(run_suite(bench, args.device, out, args.suite_timeout))
        save()
    if args.bench_repeats > 0:
        check["bench_record"] = run_bench(args.device, out, args.bench_repeats, args.bench_timeout)
    check["right"] = f"{sum(bool(s.get('right')) for s in check['scores'])}/{len(check['scores'])}"  # failed runs count
    # which batch kernel took the recorded statistics: the fused Triton one, or the per-tensor
    # fallback after a failed compile (a RuntimeWarning says why)
    from xray.dump import stats as stats_mod
    kernel = stats_mod.BATCH_KERNELS.get(torch.device(args.device).type, stats_mod._rows_one_by_one)
    check["stats_kernel"] = getattr(getattr(kernel, "func", kernel), "__qualname__", repr(kernel))
    save()
    print(f"device check on {args.device}: verdicts right {check['right']}, statistics by {check['stats_kernel']}, "
          f"suites {[(s['arch'], s.get('passed', 0), s.get('failed', 0)) for s in check['suites']]}, "
          f"{check['seconds']} s; {out / 'check.json'}")
    for line in bench_summary(check.get("bench_record") or {}):
        print(line)
    for s in check["scores"]:
        if not s.get("right"):
            print(f"  wrong or failed: {s['run']}: {s.get('error') or (s['counts'], s['first_divergence'])}"[:400])
    return 0


if __name__ == "__main__":
    sys.exit(main())
