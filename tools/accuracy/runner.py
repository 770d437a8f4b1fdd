"""Run one scenario: record bench and target, find the ground truth in the dumps, compare, score.

Ground truth is read from the dumps themselves, never assumed: the corrupted call is the k-th
record of its op kind and direction in the target dump (bench and target record the same
calls, and the fault mode counts exactly the calls the recorder sees), and on the bench side
the k-th record of that kind when both sides hold the same number of them. The module a
fault ran in is that record's ``module``.
"""
from __future__ import annotations

import copy
import dataclasses
import random
import re
import tempfile
import time
import traceback
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import numpy
import torch

import xray
from xray.compare import compare_dumps
from xray.numerics.rules import Rules

from .archs import ARCHS, run_model
from .faults import CorruptCall, CudnnRnnKernel, FusedRmsNormKernel, ReducedPrecisionMatmul, StorageReaders
from .scenario import TF32_NOISES, Scenario
from .user_bugs import CallsInside, WrongArgument

TENSORS_PER_RECORD = 64  # X_DUMP_NUM: every input and output of any op in these models
PARAM_DELTA = 0.05  # added to one weight element (weights have std ~0.02)
TARGET_ONLY_EPS = 1e-3  # relative error the target-only op brings in


XRAY_DIR = str(Path(xray.__file__).resolve().parent)


class HarnessError(Exception):
    """The scenario itself is broken (the fault never fired, no ground truth): not xray's fault."""


@dataclass
class Truth:
    bench: set[int] = field(default_factory=set)  # seqs in the bench dump that are exact hits
    target: set[int] = field(default_factory=set)  # seqs in the target dump that are exact hits
    bench_module: str | None = None
    target_module: str | None = None


@dataclass
class Outcome:
    scenario: Scenario
    seconds: float = 0.0
    truth: Truth | None = None
    summary: dict | None = None
    exact: bool | None = None
    right_module: bool | None = None
    fd_module: str | None = None
    crash: str | None = None  # xray raised: "Type: message" (traceback in ``trace``)
    harness_error: str | None = None
    trace: str = ""


# -- the two runs ----------------------------------------------------------------------------------
def _add_op(model: torch.nn.Module, path: str, fn) -> None:
    """Patch the module's forward on the instance, so the extra op runs inside its path."""
    mod = model.get_submodule(path)
    inner = mod.forward
    mod.forward = lambda *a, **k: fn(inner(*a, **k))


class Wrapper(torch.nn.Module):
    """The target model one level down under another name: every module path differs."""

    def __init__(self, name: str, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner_name = name
        self.add_module(name, inner)

    def forward(self, **kw):
        return getattr(self, self.inner_name)(**kw)


def _exported_batch_norms(model: torch.nn.Module) -> None:
    """Every batch norm runs ``_native_batch_norm_legit_no_training``: the kernel an exported
    program calls, a real op of another name, as ``cudnn_batch_norm`` is on CUDA."""
    for bn in model.modules():
        if isinstance(bn, torch.nn.BatchNorm2d):
            bn.forward = lambda x, bn=bn: torch.ops.aten._native_batch_norm_legit_no_training(
                x, bn.weight, bn.bias, bn.running_mean, bn.running_var, 0.0, bn.eps)[0]


def functional_rms_norms(model: torch.nn.Module) -> None:
    """Every RMS norm module calls F.rms_norm (as torch.nn.RMSNorm does): CPU runs it as several
    ops; under FusedRmsNormKernel it is one ``_fused_rms_norm`` call, as on CUDA."""
    for m in model.modules():
        if type(m).__name__.endswith("RMSNorm") and hasattr(m, "variance_epsilon"):
            m.forward = lambda x, m=m: torch.nn.functional.rms_norm(x, [x.shape[-1]], m.weight, m.variance_epsilon)


def seed_run() -> None:
    """Both runs draw the same random numbers (a model's random masking, router jitter or
    initial state), as a user comparing two runs seeds both (compare's "cannot tell" otherwise):
    torch's, Python's and numpy's generators, as transformers.set_seed does (WavLM's
    training-mode masks are numpy's)."""
    torch.manual_seed(RUN_SEED)
    random.seed(RUN_SEED)
    numpy.random.seed(RUN_SEED)


def _models(s: Scenario) -> tuple[torch.nn.Module, torch.nn.Module]:
    arch = ARCHS[s.arch]
    bench = arch.build()
    if s.noise == "eager-vs-sdpa":
        target = ARCHS[s.arch.replace("-eager", "-sdpa")].build()
    else:
        target = copy.deepcopy(bench)
    if s.param:
        with torch.no_grad():
            target.get_parameter(s.param).view(-1)[1] += PARAM_DELTA
    if s.attribute:
        path, name, value = s.attribute
        setattr(target.get_submodule(path), name, value)
    if s.target_only:
        _add_op(target, s.target_only, lambda y: y * (1 + TARGET_ONLY_EPS))
    if s.extra_op:
        _add_op(target, s.extra_op, lambda y: y.clone())
    if s.missing_op:
        _add_op(bench, s.missing_op, lambda y: y.clone())
    if s.noise == "fp16":
        target = target.half()
    if s.noise == "bn-kernel":
        _exported_batch_norms(target)
    if s.noise == "fused-rms-norm":
        for m in (bench, target):
            functional_rms_norms(m)
    if s.train_mode:
        bench.train(), target.train()
    if s.wrap:
        target = Wrapper(s.wrap, target)
    return bench, target


def train_batch(x: dict) -> dict:
    """A model's inputs for a training-mode run: a batch of one doubled by its mirror (a batch
    norm in training needs two values a channel)."""
    return {k: torch.cat([v, v.flip(-1)]) if isinstance(v, torch.Tensor) and v.dim() and v.shape[0] == 1 else v
            for k, v in x.items()}


def _inputs(s: Scenario, side: str) -> dict:
    x = ARCHS[s.arch].inputs()
    if s.train_mode:
        x = train_batch(x)
    if side == "target" and s.noise == "fp16":
        x = {k: v.half() if v.is_floating_point() else v for k, v in x.items()}
    return x


def _debug(s: Scenario) -> int:
    return 0x102 | (0x008 if s.backward else 0)


RUN_SEED = 0  # the global RNG's seed at each recorded forward, the same on both sides


def _record(s: Scenario, side: str, model: torch.nn.Module, folder: Path, modes: list) -> Path:
    """One recorded run; ``modes`` are entered before the recorder (they sit below it)."""
    inputs = _inputs(s, side)
    noisy = side == "target"
    threads = torch.get_num_threads()
    with ExitStack() as stack:
        for m in modes:
            stack.enter_context(m)
        if noisy and s.noise == "tf32":
            stack.enter_context(ReducedPrecisionMatmul())
        if noisy and s.noise == "fused-rms-norm":
            stack.enter_context(FusedRmsNormKernel())
        if noisy and s.noise == "cudnn-rnn":
            stack.enter_context(CudnnRnnKernel())
        if noisy and s.noise == "threads":
            torch.set_num_threads(1 if threads > 1 else 2)
            stack.callback(torch.set_num_threads, threads)
        if s.inference:  # (entered before the recorder: its session sees the forward as the user's eval would)
            stack.enter_context(torch.inference_mode())
        autocast = torch.autocast("cpu", dtype=torch.bfloat16) if noisy and s.noise == "bf16" else nullcontext()
        if noisy and s.noise == "math-sdpa":
            from torch.nn.attention import SDPBackend, sdpa_kernel
            kernel = sdpa_kernel([SDPBackend.MATH])
        else:
            kernel = nullcontext()
        seed_run()
        if s.dump == "trace":
            saved = TENSORS_PER_RECORD if s.dump_num is None else s.dump_num
            xray.begin_dump(X_DEBUG=_debug(s), X_DEDUP=s.dedup, X_DUMP_NUM=saved if s.data else 0,
                            dump_dir=folder)
            try:
                with autocast, kernel:
                    run_model(model, inputs, s.backward, s.optimizer)
            finally:
                path = xray.end_dump()
            return path
        dbg = xray.PrecisionDebugger(dump_path=folder, model=model, task="tensor" if s.data else "statistics",
                                     dump_torch_api=s.dump == "module+aten", backward=s.backward)
        dbg.start()
        try:
            with autocast, kernel:
                run_model(model, inputs, s.backward, s.optimizer)
        finally:
            dbg.stop()
            dbg.close()
        return dbg.file


# -- ground truth ----------------------------------------------------------------------------------
def _records(path: Path) -> list:
    d = xray.load_dump(path)
    try:
        return list(d.records)
    finally:
        close = getattr(d, "close", None)
        if callable(close):
            close()


def _kth(records: list, op: str, direction: str, k: int) -> tuple[object | None, int]:
    same = [r for r in records if r.kind == "op" and r.op == op and r.direction == direction]
    return (same[k] if k < len(same) else None), len(same)


def _calls_truth(bench: list, target: list, calls: list[tuple[str, str, int]]) -> Truth:
    truth = Truth()
    for op, direction, k in calls:
        t, nt = _kth(target, op, direction, k)
        b, nb = _kth(bench, op, direction, k)
        if t is None:
            raise HarnessError(f"the target dump has no call {k} of {op} ({direction})")
        truth.target.add(t.seq)
        truth.target_module = truth.target_module or t.module
        if b is not None and nb == nt:
            truth.bench.add(b.seq)
            truth.bench_module = truth.bench_module or b.module
    return truth


def _module_truth(bench: list, target: list, path: str, strip_target: str = "") -> Truth:
    """Plain module dumps: the innermost module the fault ran in, forward."""
    truth = Truth(bench_module=path, target_module=strip_target + path)
    truth.bench = {r.seq for r in bench if r.kind == "module" and r.module == path and r.direction == "forward"}
    truth.target = {r.seq for r in target if r.kind == "module" and r.module == truth.target_module
                    and r.direction == "forward"}
    if not truth.bench:
        raise HarnessError(f"no forward record of module {path} in the bench dump")
    return truth


def _located(s: Scenario, side: str, model: torch.nn.Module, folder: Path):
    """The faulty call's record (or None) in a trace of every call of ``side``'s model, run as that
    side runs (the target's kernels, autocast casts and wrapper number their calls their own way)
    with the scenario's flags (seqs count what those flags record; folded calls too)."""
    every = dataclasses.replace(s, dump="trace", dedup=False, data=False)
    rec, _ = _kth(_records(_record(every, side, model, folder, [])), s.fault.op, s.fault.direction, s.fault.call)
    return rec


def _locate(s: Scenario, model: torch.nn.Module, folder: Path) -> str:
    """The module path of the faulty call, in the bench's forward."""
    rec = _located(dataclasses.replace(s, backward=False, optimizer=None), "bench", model, folder)
    if rec is None or rec.module is None:
        raise HarnessError(f"cannot locate call {s.fault.call} of {s.fault.op} in a module")
    return rec.module


def _dedup_truth(s: Scenario, folder: Path) -> Truth:
    """De-duplicated runs: the faulty call by its seq in each side's own trace of every call. A
    folded call has no record, but compare may name its seq as the call the error entered at;
    the call's own record, where it is one, is named the same way. The bench's k-th call of the
    op, where the bench runs that op."""
    bench_model, target_model = _models(s)  # fresh models, as the recorded runs had
    b, t = _located(s, "bench", bench_model, folder / "bench"), _located(s, "target", target_model, folder / "target")
    if t is None:
        raise HarnessError(f"cannot locate call {s.fault.call} of {s.fault.op}")
    return Truth(bench={b.seq} if b is not None else set(), target={t.seq},
                 bench_module=b.module if b is not None else None, target_module=t.module)


def _user_bug_truth(s: Scenario, bench: list, target: list, inside: CallsInside, folder: Path) -> Truth:
    """A call made with a wrong argument: the ATen calls made inside it, by their seqs in the
    target's trace (with de-dup, in a trace of every call of the target, run again with the same
    bug: a folded call keeps its seq there), and the bench's same calls where it makes as many.
    A call that runs none on the target (a dropped term) is named by the bench's calls inside
    it, noted on a bench run of every call."""
    if not inside.calls:
        bench_model, _ = _models(s)
        marked = WrongArgument(s.user_bug.kind, s.user_bug, mark_only=True)
        theirs = CallsInside(marked)
        every = dataclasses.replace(s, dump="trace", dedup=False, data=False)
        bench = _records(_record(every, "bench", bench_model, folder / "bench", [marked, theirs]))
        if not theirs.calls:
            raise HarnessError(f"no ATen call ran inside {s.user_bug} on either side")
        truth = Truth()
        for op, direction, k in theirs.calls:
            b, _ = _kth(bench, op, direction, k)
            if b is None:
                raise HarnessError(f"the bench dump has no call {k} of {op} ({direction})")
            truth.bench.add(b.seq)
            truth.bench_module = truth.bench_module or b.module
        return truth
    if s.dedup:
        every = dataclasses.replace(s, dump="trace", dedup=False, data=False)
        _, target_model = _models(s)
        wrong = WrongArgument(s.user_bug.kind, s.user_bug)
        again = CallsInside(wrong)
        target = _records(_record(every, "target", target_model, folder / "target", [wrong, again]))
        if again.calls != inside.calls:
            raise HarnessError(f"{s.user_bug} ran other calls when run again: {again.calls[:3]} {inside.calls[:3]}")
        bench_model, _ = _models(s)
        bench = _records(_record(every, "bench", bench_model, folder / "bench", []))
    return _calls_truth(bench, target, inside.calls)


def _attribute_truth(bench: list, target: list, path: str, value: float) -> Truth:
    """A module attribute changed on the target (an eps): the first call in that module that
    takes it as an argument, and the bench's call of the same op there."""
    def takes(r) -> bool:
        return any(type(v) in (int, float) and not isinstance(v, bool) and v == value for v in r.inputs.values())

    calls = [r for r in target if r.kind == "op" and r.direction == "forward" and r.module == path and takes(r)]
    if not calls:
        raise HarnessError(f"no call in {path} takes {value:g} in the target dump")
    first = calls[0]
    index = [r.seq for r in target if r.kind == "op" and r.module == path and r.op == first.op].index(first.seq)
    theirs = [r for r in bench if r.kind == "op" and r.module == path and r.op == first.op]
    return Truth(target={first.seq}, bench={theirs[index].seq} if index < len(theirs) else set(),
                 bench_module=path, target_module=path)


def _target_only_truth(target: list, path: str) -> Truth:
    muls = [r for r in target if r.kind == "op" and r.direction == "forward" and r.module == path
            and r.op.startswith("aten.mul")]
    if not muls:
        raise HarnessError(f"the target-only mul in {path} is not in the target dump")
    return Truth(target={muls[-1].seq}, bench_module=path, target_module=path)


# -- scoring -----------------------------------------------------------------------------------------
def named_seqs(fd: dict) -> set[tuple[str, int]]:
    """(side, seq) pairs a first divergence names: its own record, and an origin record when
    compare reports one: keys like ``origin_bench_seq``/``origin_target_seq``, a nested dict with
    ``bench_seq``/``target_seq``, or a record name ("<module>/<op>#<seq>") in an origin text,
    taken as the side its key names (both sides when it names none)."""
    out: set[tuple[str, int]] = set()
    for key, scope in (("", fd), *((k, v) for k, v in fd.items() if isinstance(v, dict))):
        for k, v in scope.items():
            m = re.fullmatch(r"(?:\w+_)?(bench|target)_seq", k)
            if m and isinstance(v, int) and not isinstance(v, bool):
                out.add((m.group(1), v))
            elif isinstance(v, str) and "origin" in f"{key}_{k}":
                sides = [side for side in ("bench", "target") if side in f"{key}_{k}"] or ["bench", "target"]
                out.update((side, int(n)) for n in re.findall(r"#(\d+)", v) for side in sides)
            elif isinstance(v, str) and k == "culprit":  # a producer the dump does not hold (de-dup)
                out.update((side, int(n)) for n in re.findall(r"from op seq (\d+) \(not recorded", v)
                           for side in ("bench", "target"))
    return out


def _score(o: Outcome, bench: list, target: list) -> None:
    fd = o.summary.get("first_divergence")
    if o.scenario.noise_only:  # scored by its fail rows (report.py)
        return
    if fd is None:
        o.exact = o.right_module = False
        return
    truth = o.truth
    named = named_seqs(fd)
    o.exact = any(("bench", s) in named for s in truth.bench) or any(("target", s) in named for s in truth.target)
    by_seq_b = {r.seq: r for r in bench}
    by_seq_t = {r.seq: r for r in target}
    modules = []
    if fd.get("bench_seq") in by_seq_b:
        modules.append(("bench", by_seq_b[fd["bench_seq"]].module))
    if fd.get("target_seq") in by_seq_t:
        modules.append(("target", by_seq_t[fd["target_seq"]].module))
    o.fd_module = modules[0][1] if modules else None
    expected = {"bench": truth.bench_module, "target": truth.target_module}
    o.right_module = o.exact or any(m is not None and m == expected[side] for side, m in modules)


def false_divergence(fd: dict | None) -> bool:
    """Noise-only runs: a first divergence counts unless compare calls it precision loss."""
    if fd is None:
        return False
    return not any(isinstance(v, str) and "precision" in v.lower() for v in fd.values())


def _raised_in_xray(e: BaseException) -> bool:
    """The innermost frame is xray's own code (not the model's, run under the recorder)."""
    frames = traceback.extract_tb(e.__traceback__)
    return bool(frames) and frames[-1].filename.startswith(XRAY_DIR)


def _xray_frame(e: BaseException) -> str:
    """Where in xray it was raised (the innermost xray frame), for the crash list."""
    inside = [f for f in traceback.extract_tb(e.__traceback__) if f.filename.startswith(XRAY_DIR)]
    if not inside:
        return ""
    f = inside[-1]
    return f" (xray/{Path(f.filename).relative_to(XRAY_DIR)}:{f.lineno} in {f.name})"


def run_scenario(s: Scenario, workdir: Path | None = None) -> Outcome:
    o = Outcome(s)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="xray-acc-", dir=workdir) as tmp:
        tmp = Path(tmp)
        stage = "setup"
        try:
            bench_model, target_model = _models(s)
            fault = CorruptCall(s.fault.op, s.fault.call, s.fault.corruption(), s.fault.direction, s.fault.output) \
                if s.fault else None
            wrong = WrongArgument(s.user_bug.kind, s.user_bug) if s.user_bug else None
            inside = CallsInside(wrong) if wrong else None
            readers = StorageReaders(target_model.get_parameter(
                (s.wrap + "." if s.wrap else "") + s.param)) if s.param else None
            stage = "record"
            bench_dump = _record(s, "bench", bench_model, tmp / "bench", [])
            target_dump = _record(s, "target", target_model, tmp / "target",
                                  [m for m in (fault, readers, wrong, inside) if m])
            if fault and not fault.hit:
                raise HarnessError(f"the fault never fired ({fault.calls} calls of {s.fault.op})")
            if wrong and not wrong.hit:
                raise HarnessError(f"the user bug never applied ({wrong.calls} calls it applies to)")
            stage = "truth"
            bench, target = _records(bench_dump), _records(target_dump)
            o.truth = _truth(s, bench, target, fault, readers, bench_model, tmp, inside)
            stage = "compare"
            o.summary = compare_dumps(bench_dump, target_dump, rules=_rules(s)).summary.to_json()
            _score(o, bench, target)
        except HarnessError as e:
            o.harness_error = str(e)
        except Exception as e:  # counted as a crash when xray raised, else a harness bug
            text = f"{type(e).__name__}: {str(e)[:300]}"
            o.trace = traceback.format_exc()
            if stage == "compare" or (stage == "record" and _raised_in_xray(e)):
                o.crash = f"{stage}: {text}{_xray_frame(e)}"
            else:
                o.harness_error = f"{stage}: {text}"
    o.seconds = time.perf_counter() - started
    return o


def _rules(s: Scenario) -> Rules:
    """A TF32-emulated target is read as a TF32 device's dump is: its header allows TF32, which
    a CPU run's cannot (Scenario.tf32_declared)."""
    return Rules(tf32=True) if s.noise in TF32_NOISES and s.tf32_declared else Rules()


def _truth(s: Scenario, bench: list, target: list, fault, readers, bench_model, tmp: Path,
           inside: CallsInside | None = None) -> Truth:
    prefix = s.wrap + "." if s.wrap else ""
    if s.noise_only:
        return Truth()
    if s.dump == "module":
        if s.fault:
            return _module_truth(bench, target, _locate(s, bench_model, tmp / "locate"), prefix)
        path = s.param.rsplit(".", 1)[0] if s.param else s.target_only
        return _module_truth(bench, target, path, prefix)
    if s.target_only:
        return _target_only_truth(target, prefix + s.target_only)
    if s.attribute:
        return _attribute_truth(bench, target, prefix + s.attribute[0], s.attribute[2])
    if s.user_bug:
        return _user_bug_truth(s, bench, target, inside, tmp / "locate")
    if s.fault and s.dedup:
        return _dedup_truth(s, tmp / "locate")
    if s.fault:
        truth = _calls_truth(bench, target, [(s.fault.op, s.fault.direction, s.fault.call)])
        shapes = {tuple(m.shape) for r in target if r.seq in truth.target for _, m in r.output_tensors()}
        if fault.shape not in shapes:  # the dump's k-th call is not the one the mode corrupted
            raise HarnessError(f"ground truth {sorted(truth.target)} has outputs {shapes}, the fault {fault.shape}")
        return truth
    if not readers.readers:
        raise HarnessError(f"nothing read parameter {s.param}")
    return _calls_truth(bench, target, readers.readers)
