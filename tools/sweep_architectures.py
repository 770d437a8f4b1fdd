"""Every architecture of the installed transformers, on every change.

Lists every model class of the installed transformers that builds from a tiny config
(tools/accuracy/zoo.py: one class per model_type, from MODEL_MAPPING_NAMES) and runs each with
the recorder's defaults and with every call recorded (X_DEDUP=False, X_DUMP_NUM as the accuracy
harness sets it), through the accuracy harness's runner (tools/accuracy/runner.py):

- ``identical``, ``identical-train``: two identical runs, forward and forward + backward: 0 FAIL rows;
- ``bf16``, ``bf16-train``: fp32 against bf16 autocast, forward and forward + backward;
- ``tf32``, ``tf32-train``: fp32 against emulated TF32 (matmul operands rounded to 10 bits, below
  the recorder), forward and forward + backward;
- ``fp16``, ``fp16-train``: fp32 against the whole model and its inputs in float16 (a half-precision
  deployment), forward and forward + backward;
- ``threads``, ``threads-train``: the target on two threads instead of one (reductions split
  differently), forward and forward + backward;
- ``identical-trainmode``, ``bf16-trainmode``, ``tf32-trainmode``: forward + backward with both
  models in training mode (dropout drawn alike, batch norms on their batch statistics and
  writing their running ones); the others run in eval mode;
- ``fault``: K random single-call faults per precision and direction (a random op kind, a random
  call of it; 1e-2 in fp32, 5e-2 under bf16; forward and backward; ``--fault-kind few``: three
  elements doubled instead, a sparse bug; ``--fault-output any``: one of the call's floating-point
  outputs drawn at random, not its first; ``later``: one past the first, among calls with one), graded exact / module /
  wrong / missed by each side's own trace. A fault that moves the final output (the gradients,
  for a backward fault) by less than the run's own precision (bf16: what bf16 itself moves it;
  fp32: FP32_FLOOR) is left out and counted, and another is drawn (up to DRAWS times);
- ``fault-trainmode``: the same, with the faults drawn, measured and recorded in training mode
  (on the training-mode scenarios' batch: ``accuracy.runner.train_batch``);
- ``user-bug``: K bugs of a user's own per precision (fp32, bf16 autocast), forward: one call of
  a torch function made with a wrong argument (an attention mask dropped, a wrong attention scale,
  a norm's eps, GELU's approximation, a Linear's bias dropped, a wrong constant, GELU and SiLU
  swapped, a square weight transposed, a softmax's dimension, a sum's term left out:
  ``accuracy/user_bugs.py``), left out as faults are, graded exact where the first divergence
  names an ATen call made inside that call; counted apart from the kernel faults.

``--size real`` builds each model at a real width instead (1024 wide, 16 query heads on 4
key/value heads, MLP 2816, two layers, 512 tokens: ``accuracy/zoo.py``'s REAL), where reductions
are as long as a production model's; one model takes minutes there, so name the models.

Results are appended as JSON lines to ``--out`` (a rerun skips the models already there); each
model runs in a worker process under a time budget (``--timeout``). torchvision's models are
listed where torchvision is installed. Every run seeds torch's, Python's and numpy's global
RNGs alike before its forward (``accuracy.runner.seed_run``), so models that draw random numbers (ViT-MAE's masking,
Switch Transformers' router jitter, HRM's initial state) are compared as a user who seeds both
runs would. ``--inference`` runs every forward-only scenario (and
the runs that pick and grade its faults) under ``torch.inference_mode``, where a dispatch mode
sees composite ops whole (``linear``, ``scaled_dot_product_attention``) instead of the kernels
they become under autograd.

    python tools/sweep_architectures.py --out sweep.jsonl [--shard 1/2] [--models llama,gpt2]
        [--scenarios identical,bf16] [--faults 2] [--limit 20] [--timeout 60] [--inference]
    python tools/sweep_architectures.py --report sweep-1.jsonl sweep-2.jsonl   # the table only
"""
from __future__ import annotations

import argparse
import json
import os
import random
import select
import subprocess
import sys
import time
import warnings
import zlib
from collections import Counter
from contextlib import ExitStack, nullcontext
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tabulate import tabulate  # noqa: E402

# "-train": a forward and backward in eval mode; "-trainmode": the same in training mode (dropout
# drawn, batch norms on their batch statistics, their running statistics written)
SCENARIOS = ("identical", "identical-train", "identical-trainmode", "bf16", "bf16-train", "bf16-trainmode", "tf32",
             "tf32-train", "tf32-trainmode", "fp16", "fp16-train", "threads", "threads-train", "fault", "fault-trainmode",
             "user-bug")
# "fault-trainmode": the faults drawn, and their runs recorded, in training mode (forward faults
# run forward only; backward faults run a forward and backward); "user-bug": a call made with a
# wrong argument (accuracy/user_bugs.py), graded as faults are and counted apart
KERNEL_FAULTS = ("fault", "fault-trainmode")
FAULT_SCENARIOS = (*KERNEL_FAULTS, "user-bug")
NOISE_SCENARIOS = ("bf16", "bf16-train", "bf16-trainmode", "tf32", "tf32-train", "tf32-trainmode", "fp16",
                   "fp16-train", "threads", "threads-train")  # legitimate precision differences
RECORDINGS = ("defaults", "every call")
# per fault kind (accuracy.scenario.CORRUPTIONS) and precision: "rel" scales every element (a
# kernel computing at lower precision); "few" doubles three elements, plus their tensor's mean
# magnitude (a tail or an index bug: a few values wrong, the rest right)
FAULT_AMOUNTS = {"rel": {"fp32": 1e-2, "bf16": 5e-2}, "few": {"fp32": 1.0, "bf16": 1.0}}
FP32_FLOOR = 1e-6  # relative change of the final output a fp32 run cannot tell from its own rounding
DRAWS = 3  # draws per fault slot before giving up on finding one that moves the final output
FAILING = ("fail", "nan/inf")


# -- listing ---------------------------------------------------------------------------------------
def listed() -> list:
    from accuracy import zoo

    return zoo.listed() + _torchvision()


def _torchvision() -> list:
    try:
        import torchvision  # noqa: F401
    except ImportError:
        return []
    from accuracy.zoo import Entry
    from torchvision import models

    return [Entry(f"torchvision.{n}", n, "torchvision") for n in models.list_models(module=models)]


def torchvision_note() -> str:
    try:
        import torchvision
    except ImportError:
        return "torchvision is not installed: its models are not listed"
    return f"torchvision {torchvision.__version__}: its classification models are listed"


# -- one model ---------------------------------------------------------------------------------------
class _Calls:
    """Counts every call per (op, direction) as CorruptCall counts them, which of those calls a
    fault can corrupt (a new floating-point tensor computed from tensor inputs), and which of each
    one's outputs are floating-point (as slots CorruptCall's ``output`` counts)."""

    def __init__(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        from accuracy.faults import in_backward, tensor_outputs
        import torch

        calls = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                key = (str(func), "backward" if in_backward() else "forward")
                index = calls.count.get(key, 0)
                calls.count[key] = index + 1
                first = out[0] if isinstance(out, (tuple, list)) and out else out
                if (not func.is_view and not func._schema.is_mutable and isinstance(first, torch.Tensor)
                        and first.is_floating_point() and first.numel() > 0
                        and any(isinstance(a, torch.Tensor) for a in (*args, *(kwargs or {}).values()))):
                    calls.eligible.setdefault(key, []).append(index)
                    calls.outputs[(*key, index)] = [i for i, t in enumerate(tensor_outputs(out))
                                                    if t.is_floating_point()]
                return out

        self.count: dict[tuple[str, str], int] = {}
        self.eligible: dict[tuple[str, str], list[int]] = {}
        self.outputs: dict[tuple[str, str, int], list[int]] = {}
        self.mode = Mode()


INFERENCE = False  # --inference: every forward-only run under torch.inference_mode, faults picked there too


def _final(arch: str, precision: str, backward: bool, modes: list = (), train_mode: bool = False):
    """The run's final output, flattened in fp32: the model's first output, or every gradient;
    ``train_mode``: the model in training mode on the runner's training batch."""
    import torch

    from accuracy.archs import ARCHS
    from accuracy.runner import seed_run, train_batch

    a = ARCHS[arch]
    model, x = a.build(), a.inputs()
    if train_mode:
        model.train()
        x = train_batch(x)
    with ExitStack() as stack:
        if INFERENCE and not backward:
            stack.enter_context(torch.inference_mode())
        for m in modes:
            stack.enter_context(m)
        seed_run()  # random ops draw as in the recorded runs
        with torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else nullcontext():
            y = model(**x)[0]
            if backward:
                y.float().square().mean().backward()
    if not backward:
        return y.detach().float().flatten()
    return torch.cat([p.grad.float().flatten() for p in model.parameters() if p.grad is not None])


def _relative(a, b) -> float:
    import torch

    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b).clamp_min(1e-30))


def _drawn(arch: str, precision: str, backward: bool, change, clean, floor: float, train_mode: bool = False,
           **fields) -> dict:
    """One drawn change (a fault or a user's bug, a mode with ``hit``) run: the change it makes
    to the final output against the clean run's, and why it is left out: it did not fire, the
    model could not run on it, or it moves the output less than the run's own precision."""
    try:
        effect, error = _relative(_final(arch, precision, backward, [change], train_mode), clean), None
    except Exception as e:  # noqa: BLE001 - a changed value the model cannot run on
        effect, error = float("nan"), f"{type(e).__name__}: {e}"[:200]
    left_out = ("did not fire" if not change.hit else error
                or ("below the run's precision" if effect <= floor else None))
    return {"precision": precision, "direction": "backward" if backward else "forward", **fields, "effect": effect,
            "floor": floor, "fired": change.hit, "error": error, "left_out": left_out}


def _clean(arch: str, precision: str, backward: bool, train_mode: bool = False) -> tuple:
    """The clean run's final output and its own precision: what bf16 itself moves it, FP32_FLOOR in fp32."""
    clean = _final(arch, precision, backward, train_mode=train_mode)
    if precision == "fp32":
        return clean, FP32_FLOOR
    return clean, _relative(clean, _final(arch, "fp32", backward, train_mode=train_mode))


def pick_faults(arch: str, k: int, seed: int, trainable: bool, kind: str = "rel",
                train_mode: bool = False, output_draw: str = "first") -> list[dict]:
    """K faults of ``kind`` per precision and direction: a random op kind, then a random call of
    it, then which output (``output_draw``: ``first``; ``any`` of its floating-point outputs;
    ``later``: one past the first, among the calls that have one); each
    with the change it makes to the final output and that run's own precision (all of it in
    training mode where ``train_mode``)."""
    from accuracy.faults import CorruptCall
    from accuracy.scenario import CORRUPTIONS

    rng = random.Random(seed)
    out = []
    for precision in ("fp32", "bf16"):
        clean = {b: _clean(arch, precision, b, train_mode) for b in ((False, True) if trainable else (False,))}
        # counted as the fault counts them: from the same run, entered after the model and its
        # inputs are built (their construction's calls are no forward's), forward calls from a
        # forward alone (a loss's own ops are no model's)
        calls = _Calls()
        _final(arch, precision, False, [calls.mode], train_mode)
        if trainable:
            backward_calls = _Calls()
            _final(arch, precision, True, [backward_calls.mode], train_mode)
            calls.eligible.update({key: v for key, v in backward_calls.eligible.items() if key[1] == "backward"})
            calls.outputs.update({key: n for key, n in backward_calls.outputs.items() if key[1] == "backward"})
        for backward in clean:
            direction = "backward" if backward else "forward"
            eligible = {key: [c for c in indices if output_draw != "later" or len(calls.outputs[(*key, c)]) > 1]
                        for key, indices in calls.eligible.items() if key[1] == direction}
            kinds = sorted(op for (op, _), indices in eligible.items() if indices)
            for slot in range(k):
                for draw in range(DRAWS):
                    if not kinds:
                        break
                    op = rng.choice(kinds)
                    call = rng.choice(eligible[(op, direction)])
                    floating = calls.outputs[(op, direction, call)]
                    output = 0 if output_draw == "first" else rng.choice(floating if output_draw == "any"
                                                                         else floating[1:])
                    amount = FAULT_AMOUNTS[kind][precision]
                    fault = CorruptCall(op, call, CORRUPTIONS[kind](amount), direction, output)
                    f = _drawn(arch, precision, backward, fault, *clean[backward], train_mode, op=op, call=call,
                               output=output, slot=slot, draw=draw, kind=kind, amount=amount)
                    out.append(f)
                    if f["left_out"] is None:
                        break
    return out


def pick_user_bugs(arch: str, k: int, seed: int) -> list[dict]:
    """K user bugs per precision (fp32, bf16 autocast), forward: a random kind among those with
    a call to apply to, then a random call of it; each with the change it makes to the final
    output and that run's own precision, as pick_faults does."""
    from accuracy.user_bugs import BUGS, UserBug, WrongArgument

    rng = random.Random(seed ^ 0x05E2)
    out = []
    for precision in ("fp32", "bf16"):
        clean = _clean(arch, precision, False)
        counts = {}
        for kind in BUGS:
            counter = WrongArgument(kind)
            _final(arch, precision, False, [counter])
            counts[kind] = counter.calls
        kinds = sorted(kind for kind, n in counts.items() if n)
        drawn: set[tuple[str, int]] = set()
        for slot in range(k):
            for draw in range(DRAWS):
                left = [kind for kind in kinds if sum(d[0] == kind for d in drawn) < counts[kind]]
                if not left:
                    break
                kind = rng.choice(left)
                call = rng.choice([c for c in range(counts[kind]) if (kind, c) not in drawn])
                drawn.add((kind, call))
                f = _drawn(arch, precision, False, WrongArgument(kind, UserBug(kind, call)), *clean, op=kind,
                           call=call, slot=slot, draw=draw, kind="user-bug", applicable=counts[kind])
                out.append(f)
                if f["left_out"] is None:
                    break
    return out


def _trainable(arch: str) -> str | None:
    """None when a backward of the first output runs, else why not."""
    try:
        g = _final(arch, "fp32", True)
        return None if g.numel() else "no parameter gets a gradient"
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"[:200]


def _row_info(row) -> dict | None:
    if row is None:
        return None
    return {"op": row.target_op or row.bench_op, "module": row.module, "status": row.status, "origin": row.origin,
            "cause": row.cause, "culprit": row.culprit[:160], "mode": row.mode, "max_rel_err": row.max_rel_err,
            "note": row.note[:200], "bench_seq": row.bench_seq, "target_seq": row.target_seq}


def _capture_first_fail() -> dict:
    """The first FAIL/NaN row of the runner's last compare (its Outcome keeps the summary only)."""
    from accuracy import runner

    last: dict = {}
    compare = runner.compare_dumps

    def capturing(bench, target, **kw):
        result = compare(bench, target, **kw)
        last["row"] = next((r for r in result.rows if r.status in FAILING), None)
        return result

    runner.compare_dumps = capturing
    return last


def sweep_model(entry, chosen: tuple[str, ...], k: int, seed: int, emit, fault_kind: str = "rel",
                output_draw: str = "first", size: str = "tiny") -> None:
    """Every chosen scenario of one model, each recording; one JSON line per scenario, then the model's."""
    import torch

    from accuracy import report, zoo
    from accuracy.runner import run_scenario
    from accuracy.scenario import Fault, Scenario
    from accuracy.scenarios import RECORDER_DEFAULTS
    from accuracy.user_bugs import UserBug

    started = time.perf_counter()
    base = {"model": entry.model_type, "family": entry.model_type, "class": entry.cls, "source": entry.source,
            **({"size": size} if size != "tiny" else {})}
    try:
        arch = zoo.register(entry, size)
    except Exception as e:  # noqa: BLE001
        emit({"kind": "model", **base, "status": "not buildable", "reason": str(e)[:300],
              "seconds": round(time.perf_counter() - started, 1)})
        return
    model = torch.nn.Module()
    try:
        from accuracy.archs import ARCHS
        model = ARCHS[arch].build()
    except Exception:  # noqa: BLE001
        pass
    params = sum(p.numel() for p in model.parameters())
    no_backward = _trainable(arch)
    seed ^= zlib.crc32(entry.model_type.encode())
    faults = [("fault", f) for f in pick_faults(arch, k, seed, no_backward is None, fault_kind,
                                                output_draw=output_draw)] if "fault" in chosen else []
    if "fault-trainmode" in chosen:
        faults += [("fault-trainmode", f) for f in pick_faults(arch, k, seed, no_backward is None, fault_kind, True,
                                                               output_draw)]
    if "user-bug" in chosen:
        faults += [("user-bug", f) for f in pick_user_bugs(arch, k, seed)]
    last = _capture_first_fail()
    recordings = {"defaults": RECORDER_DEFAULTS, "every call": {"dedup": False, "dump_num": None}}
    noise = {"identical": {}, "identical-train": {"backward": True}, "bf16": {"noise": "bf16"},
             "bf16-train": {"noise": "bf16", "backward": True}, "tf32": {"noise": "tf32"},
             "tf32-train": {"noise": "tf32", "backward": True}, "fp16": {"noise": "fp16"},
             "fp16-train": {"noise": "fp16", "backward": True}, "threads": {"noise": "threads"},
             "threads-train": {"noise": "threads", "backward": True},
             **{f"{name}-trainmode": {**kw, "backward": True, "train_mode": True}
                for name, kw in (("identical", {}), ("bf16", {"noise": "bf16"}), ("tf32", {"noise": "tf32"}))}}
    runs = 0
    for recording, flags in recordings.items():
        plan = [(name, kw, None) for name, kw in noise.items() if name in chosen
                and not (name.endswith(("-train", "-trainmode")) and no_backward)]
        plan += [(name, {"noise": "bf16" if f["precision"] == "bf16" else None,
                         "backward": f["direction"] == "backward",
                         **({"train_mode": True} if name == "fault-trainmode" else {})}, f) for name, f in faults]
        for name, kw, f in plan:
            line = {"kind": "scenario", **base, "recording": recording, "scenario": name, **kw}
            if f is not None:
                line["fault"] = f
                if f["left_out"]:
                    emit({**line, "verdict": "left out"})
                    continue
                kw = {**kw, "user_bug": UserBug(f["op"], f["call"])} if name == "user-bug" else \
                    {**kw, "fault": Fault(f["op"], f["call"], f.get("kind", "rel"), f["amount"], f["direction"],
                                          f.get("output", 0))}
            s = Scenario(name=f"{arch}/{recording}/{name}", cls=name, arch=arch, **kw, **flags,
                         inference=INFERENCE and not kw.get("backward"))
            last.clear()
            o = run_scenario(s)
            runs += 1
            fd = (o.summary or {}).get("first_divergence")
            line.update(rows=(o.summary or {}).get("rows"), fail_rows=report.fail_rows(o),
                        compare_verdict=(o.summary or {}).get("verdict"),
                        first_fail=_row_info(last.get("row")), crash=o.crash, harness_error=o.harness_error,
                        seconds=round(o.seconds, 2),
                        first_divergence={k_: fd.get(k_) for k_ in ("op", "target_op", "module", "cause", "origin",
                                                                     "bench_seq", "target_seq") if k_ in fd}
                        if fd else None)
            line["verdict"] = _verdict(line, o)
            emit(line)
    emit({"kind": "model", **base, "status": "ok", "params": params, "backward": no_backward or "yes",
          "scenarios": runs, "seconds": round(time.perf_counter() - started, 1)})


def _verdict(line: dict, o) -> str:
    if o.harness_error:
        return "harness error"
    if line["scenario"] not in FAULT_SCENARIOS:
        return "crash" if o.crash else "FAIL" if line["fail_rows"] else "clean"
    if o.crash:
        return "missed"  # a crash names nothing
    return "exact" if o.exact else "module" if o.right_module else "wrong" if line["first_divergence"] else "missed"


# -- the worker and its supervisor --------------------------------------------------------------------
def worker(args) -> int:
    """Run the named models in order, appending JSON lines to --out; BEGIN/END lines on stdout
    let the supervisor time each model."""
    global INFERENCE
    warnings.simplefilter("ignore")
    import torch

    torch.set_num_threads(1)
    INFERENCE = args.inference
    entries = {e.model_type: e for e in listed()}
    chosen = tuple(args.scenarios.split(","))
    with open(args.out, "a") as out:
        def emit(line: dict) -> None:
            out.write(json.dumps(line, default=str) + "\n")
            out.flush()

        for name in args.models.split(","):
            print(f"BEGIN {name}", flush=True)
            try:
                sweep_model(entries[name], chosen, args.faults, args.seed, emit, args.fault_kind,
                            args.fault_output, args.size)
            except Exception as e:  # noqa: BLE001 - one model's failure must not lose the others
                emit({"kind": "model", "model": name, "family": name, "status": "error",
                      "reason": f"{type(e).__name__}: {e}"[:300]})
            print(f"END {name}", flush=True)
    return 0


def done_models(paths: list[Path]) -> set[str]:
    return {r["model"] for r in read_lines(paths) if r.get("kind") == "model"}


def read_lines(paths: list[Path]) -> list[dict]:
    out = []
    for p in paths:
        if p.exists():
            for line in p.read_text().splitlines():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:  # a line cut by a kill
                    pass
    return out


def _lines(proc, late):
    """The worker's stdout lines as they come (os.read, not readline: a line held in a buffer
    hides from select); None when ``late()`` turns true before the next line."""
    pending = b""
    while True:
        ready, _, _ = select.select([proc.stdout], [], [], 1.0)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                return
            *done, pending = (pending + chunk).split(b"\n")
            yield from (d.decode() for d in done)
        elif late():
            yield None
            return


def supervise(todo: list[str], args) -> None:
    """Workers run the models in turn; one that spends more than --timeout on a model is killed,
    the model is recorded as timed out, and a fresh worker goes on with the rest."""
    log = open(Path(str(args.out) + ".log"), "a")
    while todo:
        cmd = [sys.executable, __file__, "--worker", "--out", str(args.out), "--models", ",".join(todo),
               "--scenarios", args.scenarios, "--faults", str(args.faults), "--seed", str(args.seed),
               "--fault-kind", args.fault_kind, "--fault-output", args.fault_output, "--size", args.size] \
            + (["--inference"] if args.inference else [])
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, start_new_session=True)
        current, began, first, budget = None, time.monotonic(), None, args.timeout
        for line in _lines(proc, lambda: current is not None and time.monotonic() - began > budget):
            if line is None:  # over budget
                os.killpg(proc.pid, 9)
                proc.wait()
                with open(args.out, "a") as out:
                    out.write(json.dumps({"kind": "model", "model": current, "family": current, "status": "timeout",
                                          "reason": f"over {args.timeout:.0f} s"}) + "\n")
                print(f"{current}: timed out after {args.timeout:.0f} s", flush=True)
                todo.remove(current)
                current = None
                break
            word, _, name = line.strip().partition(" ")
            if word == "BEGIN":
                current, began, first = name, time.monotonic(), first or name
                budget = args.timeout + (120 if current == first else 0)  # a fresh worker imports torch first
            elif word == "END":
                todo.remove(name)
                current = None
                print(f"{name}: {time.monotonic() - began:.0f} s", flush=True)
        proc.wait()
        if proc.returncode not in (0, -9) and todo and current in todo:  # died inside a model
            with open(args.out, "a") as out:
                out.write(json.dumps({"kind": "model", "model": current, "family": current, "status": "error",
                                      "reason": f"worker exited {proc.returncode}"}) + "\n")
            todo.remove(current)


# -- the table ---------------------------------------------------------------------------------------------
def _pct(n: int, d: int) -> str:
    return f"{100.0 * n / d:.1f}" if d else "-"


def figures(lines: list[dict]) -> dict:
    """Per recording: identical runs with FAIL rows, noise runs with FAIL rows, fault grades."""
    out = {}
    for recording in RECORDINGS:
        mine = [r for r in lines if r.get("kind") == "scenario" and r["recording"] == recording]
        ident = [r for r in mine if r["scenario"].startswith("identical") and r["verdict"] != "harness error"]
        noise = [r for r in mine if r["scenario"] in NOISE_SCENARIOS and r["verdict"] != "harness error"]
        faults = [r for r in mine if r["scenario"] in KERNEL_FAULTS]
        graded = Counter(r["verdict"] for r in faults)
        n = sum(graded[v] for v in ("exact", "module", "wrong", "missed"))
        users = Counter(r["verdict"] for r in mine if r["scenario"] == "user-bug")
        out[recording] = {
            "identical": len(ident), "identical_fail": sum(r["verdict"] != "clean" for r in ident),
            "noise": len(noise), "noise_fail": sum(r["verdict"] != "clean" for r in noise),
            "user_bugs": sum(users[v] for v in ("exact", "module", "wrong", "missed")),
            **{f"user_{v}": users[v] for v in ("exact", "module", "wrong", "missed", "left out")},
            "faults": n, **{v: graded[v] for v in ("exact", "module", "wrong", "missed")},
            "left_out": graded["left out"], "harness_errors": sum(r["verdict"] == "harness error" for r in mine),
            "crashes": sum(bool(r.get("crash")) for r in mine)}
    return out


def _bad(f: dict) -> bool:
    return any(v["identical_fail"] or v["noise_fail"] or v["wrong"] or v["missed"] or v["module"]
               or v["user_bugs"] != v["user_exact"] for v in f.values())


def table(lines: list[dict], every_family: bool = False) -> str:
    models = {r["model"]: r for r in lines if r.get("kind") == "model"}
    rows = []
    families = sorted({r["family"] for r in lines if r.get("kind") == "scenario"})
    for family in families:
        mine = [r for r in lines if r.get("family") == family]
        f = figures(mine)
        if not (_bad(f) or every_family):
            continue
        for recording, v in f.items():
            rows.append([family, recording, f"{v['identical_fail']}/{v['identical']}",
                         f"{v['noise_fail']}/{v['noise']}", v["faults"], _pct(v["exact"], v["faults"]),
                         _pct(v["module"], v["faults"]), _pct(v["wrong"], v["faults"]),
                         _pct(v["missed"], v["faults"]), v["left_out"], v["crashes"]])
    headers = ["family", "recording", "identical FAIL", "noise FAIL", "faults", "exact %", "module %", "wrong %",
               "missed %", "left out", "crashes"]
    status = Counter(m["status"] for m in models.values())
    ran = sorted({r["family"] for r in lines if r.get("kind") == "scenario"})
    text = [tabulate(rows, headers=headers) if rows else "(no family with a FAIL row or an inexact fault)",
            "", f"{len(models)} architectures listed and tried: " + ", ".join(f"{n} {s}" for s, n in status.most_common())
            + f"; {len(ran)} run, {sum(not _bad(figures([r for r in lines if r.get('family') == fam])) for fam in ran)} "
            "of them with no FAIL row and every fault exact"]
    for recording, v in figures(lines).items():
        text.append(f"totals, {recording}: identical runs with FAIL rows {v['identical_fail']} of {v['identical']}; "
                    f"noise runs with FAIL rows {v['noise_fail']} of {v['noise']} ({_pct(v['noise_fail'], v['noise'])} %); "
                    f"faults {v['faults']}: exact {_pct(v['exact'], v['faults'])} %, module "
                    f"{_pct(v['module'], v['faults'])} %, wrong {_pct(v['wrong'], v['faults'])} %, missed "
                    f"{_pct(v['missed'], v['faults'])} %; {v['left_out']} left out (below the run's precision), "
                    f"{v['harness_errors']} harness errors, {v['crashes']} crashes")
        if v["user_bugs"] or v["user_left out"]:
            text.append(f"user bugs, {recording}: {v['user_bugs']}: exact {_pct(v['user_exact'], v['user_bugs'])} %, "
                        f"module {_pct(v['user_module'], v['user_bugs'])} %, wrong "
                        f"{_pct(v['user_wrong'], v['user_bugs'])} %, missed {_pct(v['user_missed'], v['user_bugs'])} %; "
                        f"{v['user_left out']} left out")
    return "\n".join(text)


def failures(lines: list[dict]) -> list[str]:
    """One line per identical or noise run with FAIL rows: the first failing row's op and why."""
    out = []
    for r in lines:
        if r.get("kind") == "scenario" and r["scenario"] not in FAULT_SCENARIOS \
                and r["verdict"] not in ("clean", "harness error"):
            ff = r.get("first_fail") or {}
            why = ", ".join(f"{k}={ff[k]}" for k in ("status", "origin", "cause", "module", "note") if ff.get(k))
            out.append(f"{r['model']} [{r['recording']}] {r['scenario']}: {r.get('fail_rows')} FAIL rows; first "
                       f"{ff.get('op', '-')} ({why})" + (f"; crash {r['crash'][:150]}" if r.get("crash") else ""))
    return out


# -- main ----------------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("sweep.jsonl"), help="JSON lines, appended; a rerun resumes")
    ap.add_argument("--shard", default="1/1", help="i/n: every n-th listed model from the i-th (1-based)")
    ap.add_argument("--models", help="comma-separated model_types (default: every listed one)")
    ap.add_argument("--limit", type=int, help="at most this many models (after sharding)")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="a subset of " + ",".join(SCENARIOS))
    ap.add_argument("--faults", type=int, default=2, help="K: faults per precision and direction")
    ap.add_argument("--fault-kind", choices=sorted(FAULT_AMOUNTS), default="rel",
                    help="rel: every element of the call's output off by 1e-2 (fp32) or 5e-2 (bf16); "
                         "few: three elements doubled (a sparse bug)")
    ap.add_argument("--size", choices=("tiny", "real"), default="tiny",
                    help="real: each model 1024 wide (16 query heads, 4 key/value heads, MLP 2816), two layers, "
                         "on 512 tokens (accuracy/zoo.py's REAL); give it --models and a --timeout of minutes")
    ap.add_argument("--fault-output", choices=("first", "any", "later"), default="first",
                    help="first: a fault corrupts the call's first output; any: one of its floating-point outputs "
                         "drawn at random (a layer norm's mean, an attention's logsumexp, a key or value gradient); "
                         "later: one past the first, drawn among the calls that have one")
    ap.add_argument("--inference", action="store_true",
                    help="forward-only runs under torch.inference_mode (composite ops such as linear and "
                         "scaled_dot_product_attention reach the recorder whole); training steps as before")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per model")
    ap.add_argument("--report", type=Path, nargs="*", help="print the table of these JSON-lines files and exit")
    ap.add_argument("--every-family", action="store_true", help="a table row for every family, clean ones too")
    ap.add_argument("--list", action="store_true", help="list the architectures and exit")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    unknown = set(args.scenarios.split(",")) - set(SCENARIOS)
    if unknown:
        ap.error(f"unknown scenarios {sorted(unknown)}; choose from {', '.join(SCENARIOS)}")
    if args.worker:
        return worker(args)
    if args.report is not None:
        lines = read_lines(args.report)
        print(table(lines, args.every_family))
        for f in failures(lines):
            print(f)
        return 0
    warnings.simplefilter("ignore")
    entries = listed()
    if args.list:
        for e in entries:
            print(f"{e.model_type:32s} {e.cls}")
        print(f"{len(entries)} architectures; {torchvision_note()}")
        return 0
    names = [e.model_type for e in entries]
    if args.models:
        wanted = args.models.split(",")
        missing = [m for m in wanted if m not in names]
        if missing:
            ap.error(f"not a listed model_type: {', '.join(missing)} (see --list)")
        names = wanted
    i, n = (int(x) for x in args.shard.split("/"))
    names = names[i - 1::n]
    if args.limit is not None:
        names = names[:args.limit]
    done = done_models([args.out])
    todo = [m for m in names if m not in done]
    print(f"{len(entries)} architectures listed ({torchvision_note()}); shard {args.shard}: {len(names)}, "
          f"{len(names) - len(todo)} already in {args.out}", flush=True)
    started = time.perf_counter()
    supervise(todo, args)
    lines = [r for r in read_lines([args.out]) if r.get("model") in set(names)]
    print(table(lines, args.every_family))
    for f in failures(lines):
        print(f)
    print(f"wall time {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
