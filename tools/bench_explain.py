"""How long ``xray explain`` and ``xray fix`` take, and what they find, against the 60 s goal.

Runs the real command lines in fresh processes (the totals include importing torch and
transformers, as a user's run does) and reads the results from explain.json / fix.json:

- explain: the demo Llama (2 layers, hidden 64, 2x16 tokens), bf16 autocast target with the
  demo's broken matmul call (``--inject aten.mm.default#5+0.05``);
- fix: a T5 (2+2 layers, d_model 128) whose one FF layer overflows fp16, fp16 autocast
  target, bound 1e-2;
- with ``--real``: explain at real size (Llama hidden 1024, 512 tokens, one layer, module level
  only), same fault;
- with ``--sweep``: the same fault on every ``aten.mm`` call of the demo Llama in turn, bf16
  target, module level only: how often explain ranks the faulted call's module first (the
  module read from a recorded dump of the bench run, not from explain);
- with ``--scale``: explain at scale, counted in forwards (a hook on the model's root, so
  every forward of bench, target and graft runs counts): ``--search tree`` on ``deep_llama``
  (32 layers, hidden 256) with +0.05 on layer 20's up_proj, against measuring every module
  (its forwards per module counted on the same model with 2 layers, times the modules).

    python tools/bench_explain.py [--real] [--sweep] [--scale] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

ROOT = Path(__file__).resolve().parents[1]
GOAL_S = 60.0
FAULT = "aten.mm.default#5+0.05"


def cli(args: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRANSFORMERS_VERBOSITY="error")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "xray.cli", *args], capture_output=True, text=True, env=env)
    return time.perf_counter() - start, proc


def explain_row(out: Path, factory: str, label: str, extra: list[str] = ()) -> list:
    wall, proc = cli(["explain", factory, "--target", "cpu:bf16", "--inject", FAULT, "--out", str(out), *extra])
    if proc.returncode != 0:
        raise SystemExit(f"xray explain failed ({proc.returncode}): {proc.stderr[-2000:]}")
    x = json.loads((out / "explain.json").read_text())
    found = f"top {x['top']}; call {x['top_op'] or '-'}"
    result = f"error {x['error']:.3g} -> {x['error_without_top']:.3g} grafted; rest spread: {x['rest'].get('spread')}"
    return [label, f"{x['seconds']:.1f}", f"{wall:.1f}", "yes" if wall <= GOAL_S else "NO", found, result]


def fix_row(out: Path) -> list:
    wall, proc = cli(["fix", "xray.explain.examples:t5_fp16_overflow", "--target", "cpu:fp16", "--max-error", "1e-2",
                      "--out", str(out)])
    if proc.returncode != 0:
        raise SystemExit(f"xray fix failed ({proc.returncode}): {proc.stderr[-2000:]}")
    f = json.loads((out / "fix.json").read_text())
    return ["fix: T5 fp16 overflow, bound 1e-2", f"{f['seconds']:.1f}", f"{wall:.1f}",
            "yes" if wall <= GOAL_S else "NO", f"{len(f['modules'])} island(s): {', '.join(f['modules'])}"
            + "".join(f"; then ops: {m} {', '.join(o)}" for m, o in f["ops"].items()),
            f"error {f['error_before']} -> {f['error_after']:.3g}"
            + (f", ops {f['error_after_ops']:.3g}" if f["ops"] else "") + f" ({len(f['trials'])} trial runs)"]


def sweep(offset: float = 0.05) -> list:
    """Fault each aten.mm call of the demo Llama in turn; count explain's top module hits."""
    sys.path.insert(0, str(ROOT))
    import torch

    import xray
    from xray.demo.inject import FaultSpec, InjectFault
    from xray.explain import analysis
    from xray.explain.examples import demo_llama
    from xray.explain.trees import error

    model, args = demo_llama()
    with tempfile.TemporaryDirectory(prefix="bench-explain-sweep-") as tmp:
        with torch.no_grad(), xray.dump(dump_dir=tmp, X_DEDUP=False, X_DUMP_NUM=0) as session:
            model(*args)
        with xray.load_dump(session.folder) as dump:
            modules = [r.module for r in dump.records if r.op == "aten.mm.default"]
    def final_error(target: str, context=None) -> float:
        _, runs, tcap, _ = analysis.capture_both(model, args, {}, "cpu", target, context)
        return error(tcap.final, runs.bench.final)

    noise = final_error("cpu:bf16")  # what bf16 alone makes
    hits, weak, misses, seconds = 0, [], [], []
    for call, module in enumerate(modules):
        spec = FaultSpec(op="aten.mm.default", call=call, scale=1.0, offset=offset)
        fault = final_error("cpu", lambda: InjectFault(spec))  # what the fault alone makes, in fp32
        if fault <= noise:  # a fault bf16's own error hides: nothing to rank first
            weak.append(f"call {call} ({module}: {fault:.2g})")
            continue
        x = analysis.explain(model, args, target="cpu:bf16", target_context=lambda: InjectFault(spec),
                             op_modules=0, residual=False)
        seconds.append(x.seconds)
        if x.top == module:
            hits += 1
        else:
            misses.append(f"call {call} in {module}: top {x.top}")
    found = f"faulted module first in {hits} of {len(modules) - len(weak)} faults above bf16's error {noise:.2g}"
    return [f"sweep: +{offset} on each of {len(modules)} aten.mm calls, bf16", f"{sum(seconds):.1f}", "", "", found,
            "; ".join(misses) or "no miss" + (f"; below bf16's error, not ranked: {', '.join(weak)}" if weak else "")]


def scale(layers: int = 32, fault: str = "model.layers.20.mlp.up_proj") -> list:
    """Forwards of ``--search tree`` on a deep decoder against every module measured."""
    sys.path.insert(0, str(ROOT))
    from xray.explain import analysis
    from xray.explain.examples import deep_llama, module_fault

    def counted(n: int, search: str, where: str, target: str):
        model, args = deep_llama(layers=n)
        forwards = [0]
        model.register_forward_pre_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
        x = analysis.explain(model, args, target=target, target_context=module_fault(model, where), op_modules=0,
                             search=search)
        return x, forwards[0], len([r for r in x.rows if r.kind == "module"])

    small, n_small, m_small = counted(2, "all", "model.layers.0.mlp.up_proj", "cpu:bf16")
    per_module = n_small / m_small
    x, n, m = counted(layers, "tree", fault, "cpu:bf16")
    measured = sum(r.kind == "module" and r.share is not None for r in x.rows)
    return [f"explain --search tree: Llama {layers} layers h256, +0.05 on {fault}, bf16", f"{x.seconds:.1f}", "", "",
            f"top {x.top} ({100 * x.ranking()[0].self_share:.0f}%)",
            f"{n} forwards ({measured} of {m} modules measured) vs {per_module:.2f} a module x {m} = "
            f"{per_module * m:.0f} for every module ({n_small} on 2 layers): {per_module * m / n:.0f}x fewer"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--real", action="store_true", help="add explain at real size (hidden 1024, 512 tokens)")
    ap.add_argument("--sweep", action="store_true", help="add the fault-position sweep (module level)")
    ap.add_argument("--scale", action="store_true", help="add explain at scale (--search tree, forwards counted)")
    ap.add_argument("--json", default=None, help="also write the rows as JSON")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-explain-") as tmp:
        tmp = Path(tmp)
        rows = [explain_row(tmp / "demo", "xray.explain.examples:demo_llama", "explain: demo Llama bf16 + fault"),
                fix_row(tmp / "fix")]
        if args.real:
            rows.append(explain_row(tmp / "real", "xray.explain.examples:real_llama",
                                    "explain: Llama h1024 x 512 tok bf16 + fault", ["--op-modules", "0",
                                                                                    "--threads", "0"]))
    if args.sweep:
        rows.append(sweep())
    if args.scale:
        rows.append(scale())
    head = ["run", "compute s", "wall s (fresh process)", f"<= {GOAL_S:.0f} s", "found", "result"]
    print(tabulate(rows, head, tablefmt="github"))
    if args.json:
        Path(args.json).write_text(json.dumps([dict(zip(head, r)) for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
