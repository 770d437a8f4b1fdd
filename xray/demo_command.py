"""``xray demo``: the whole workflow on a real transformers model built from a small config.

Every step runs the same public command a user would type (it is printed before it runs), and
every artefact lands in one folder; the last screen says where each one is.
"""
from __future__ import annotations

import html
import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

# The "target device" of the demo has a broken matmul kernel: float32 mm results come out
# 0.05 too high. The generated op tests run their reference in float64, so only the device
# side is hit, exactly as on real hardware with a kernel bug.
BROKEN_DEVICE_CONFTEST = '''
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode


class BrokenMatmul(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.mm.default and out.dtype == torch.float32:
            out = out + 0.05
        return out


@pytest.fixture(autouse=True)
def broken_matmul():
    with BrokenMatmul():
        yield
'''


# A representative slice of a Llama's ops for the demo's replay (the full set takes minutes):
# matmuls, the attention softmax, RMSNorm's pieces, SiLU, RoPE's trigonometry, the KV-cache cat.
DEMO_REPLAY_OPS = ["aten.mm.default", "aten.bmm.default", "aten._softmax.default", "aten.rsqrt.default",
                   "aten.silu.default", "aten.mean.dim", "aten.pow.Tensor_Scalar", "aten.cat.default",
                   "aten.cos.default", "aten.embedding.default", "aten.neg.default", "aten.mul.Tensor"]


def _bold(text: str) -> str:
    """Bold on a terminal; plain text in files and pipes."""
    return f"\033[1m{text}\033[0m" if sys.stdout.isatty() else text


def _say(step: str) -> None:
    print("\n" + _bold(f"== {step}"), flush=True)


def _cmd(text: str) -> None:
    print(f"$ {text}", flush=True)


def _pytest(folder: Path, csv: Path) -> int:
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(folder),
                           "--device", "cpu", "--seed", "42", f"--detail_compare_path={csv}"],
                          capture_output=True, text=True)
    tail = [line for line in proc.stdout.splitlines() if line.strip()][-1:]
    print("\n".join(tail))
    return proc.returncode


# Written into every folder the demo creates: only such a folder is ever emptied by a later run.
OUT_MARKER = ".xray-demo-output"


def _claim_out(out: Path) -> str | None:
    """Make ``out`` an empty demo folder; returns why not (None when done). A folder that holds
    anything and lacks OUT_MARKER is the user's (``--out .`` used to empty the current folder):
    it is refused, never deleted."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        return f"--out {out} exists and is not a folder; pass a new or empty folder"
    if out.is_dir() and any(out.iterdir()):
        if not (out / OUT_MARKER).is_file():
            return (f"--out {out} is not empty and was not created by xray demo; "
                    "pass a new or empty folder (nothing was deleted)")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / OUT_MARKER).write_text("created by `xray demo`; a later `xray demo --out` here replaces this folder\n")
    return None


def run_demo(out: Path, *, small: bool = False, replay: bool = True) -> int:
    import pandas as pd
    import torch

    from xray.compare import compare_dumps
    from xray.compare.report import terminal_report, write_csv, write_html, write_summary_json
    from xray.gen import cli as gen_cli
    from xray.gen import diff as diff_cli

    from xray.demo.examples import DEMO_FAULT, record_dedup, record_pair

    started = time.perf_counter()
    refusal = _claim_out(out)
    if refusal:
        print(f"xray demo: error: {refusal}", file=sys.stderr)
        return 2
    layers, hidden, seq = (1, 32, 8) if small else (2, 64, 16)
    artefacts: list[tuple[str, Path]] = []

    _say(f"1-2/7 record a {layers}-layer Llama (hidden {hidden}) twice: CPU fp32 (bench) and a "
         f"'target device' = bf16 autocast + a broken kernel on call {DEMO_FAULT.call} of {DEMO_FAULT.op}")
    _cmd("with xray.dump(X_DEDUP=False, X_DUMP_NUM=8): model(ids)")
    with torch.no_grad():
        bench, target, hit = record_pair(out / "dumps", layers=layers, hidden=hidden, seq=seq, dump_num=8)
    assert hit, "the injected fault did not fire"
    artefacts += [("bench dump (fp32)", bench), ("target dump (bf16 + fault)", target)]
    print(f"bench: {bench}\ntarget: {target}")

    _say("3/7 compare the two runs: where do they diverge, and is it precision or a bug?")
    csv = out / "compare.csv"
    _cmd(f"xray-compare {bench} {target} {csv} --html {out / 'compare.html'}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = compare_dumps(bench, target, progress=False)
    write_csv(result, csv)
    write_summary_json(result, out / "compare-summary.json")
    write_html(result, out / "compare.html")
    print(terminal_report(result, worst=5))  # its last line is compare's verdict
    s = result.summary
    first = s.first_divergence or {}
    verdict = _verdict(result)
    import xray

    calls = [r.seq for r in xray.load_dump(bench).records if r.op == DEMO_FAULT.op]
    injected = calls[DEMO_FAULT.call] if DEMO_FAULT.call < len(calls) else None
    found = first.get("bench_seq") == injected and first.get("origin") == "born"
    print(f"the injected fault was bench record #{injected}: "
          + ("xray found it." if found else "xray did NOT name it (please report this)."))
    artefacts += [("compare CSV", csv), ("compare report (HTML)", out / "compare.html"),
                  ("compare summary (JSON)", out / "compare-summary.json")]

    _say("4/7 generate de-duplicated op tests from the bench dump and run them on 'cpu'")
    suite = out / "pytests"
    _cmd(f"xray-gen {bench / 'dump.json'} -o {suite}")
    gen_cli.main([str(bench / "dump.json"), "-o", str(suite), "-q"])
    _cmd(f"pytest {suite} --device cpu --seed 42 --detail_compare_path={out / 'ops-cpu.csv'}")
    rc_cpu = _pytest(suite, out / "ops-cpu.csv")

    _say("5/7 run the same tests on the 'target device' (its mm kernel is broken), then diff the CSVs")
    broken = out / "pytests-target"
    shutil.copytree(suite, broken)
    (broken / "conftest.py").write_text((suite / "conftest.py").read_text() + BROKEN_DEVICE_CONFTEST)
    _cmd(f"pytest {broken} --device <target> ... --detail_compare_path={out / 'ops-target.csv'}")
    _pytest(broken, out / "ops-target.csv")
    _cmd(f"xray-diff {out / 'ops-cpu.csv'} {out / 'ops-target.csv'} {out / 'ops-diff.csv'}")
    diff_cli.main([str(out / "ops-cpu.csv"), str(out / "ops-target.csv"), str(out / "ops-diff.csv"), "--top", "5"])
    ops = pd.read_csv(out / "ops-target.csv")
    failing = sorted(set(ops.loc[~ops["is_pass"].astype(bool), "op_name"]))
    print(f"ops failing on the target device: {', '.join(failing) or 'none'}")
    artefacts += [("generated op tests", suite), ("op results, cpu", out / "ops-cpu.csv"),
                  ("op results, target", out / "ops-target.csv"), ("op diff", out / "ops-diff.csv")]

    replay_dir = out / "replay"
    if replay:
        _say("6/7 replay the recorded ops on ONNX Runtime and ExecuTorch (XNNPACK)")
        backends = ["onnxrt-cpu", "executorch-xnnpack"]
        ops = DEMO_REPLAY_OPS[:8] if small else DEMO_REPLAY_OPS
        args = [str(out / "dumps" / "llama-dedup-src"), *sum((["--backend", b] for b in backends), []),
                *sum((["--op", o] for o in ops), []), "--out", str(replay_dir)]
        with torch.no_grad():
            record_dedup(out / "dumps" / "llama-dedup-src", layers=layers, hidden=hidden, seq=seq)
        _cmd("xray-replay " + " ".join(args))
        from xray.replay.cli import main as replay_main

        replay_main(args)
        artefacts += [("replay support matrix", replay_dir / "heatmap.html"),
                      ("replay support matrix (CSV)", replay_dir / "matrix.csv")]
        _drift_section(out, layers, hidden, seq)
        artefacts.append(("whole-model drift (JSON)", out / "drift" / "drift.json"))
    else:
        _say("6/7 replay skipped (--no-replay)")

    _say("7/7 write the HTML report")
    index = out / "index.html"
    _write_index(index, out, artefacts, verdict, first, failing)
    artefacts.append(("this report (open it)", index))

    print("\n" + _bold(f"Done in {time.perf_counter() - started:.0f} s. Everything is in {out}/:"))
    width = max(len(k) for k, _ in artefacts)
    for what, where in artefacts:
        print(f"  {what:<{width}}  {where}")
    return 0 if rc_cpu == 0 else 1


def _drift_section(out: Path, layers: int, hidden: int, seq: int) -> None:
    """The whole model on ONNX Runtime, its deployed graph holding one wrong weight: xray drift
    names the layer where it starts to drift."""
    import xray
    from xray.drift.examples import onnx_weight_fault, tiny_llama
    from xray.drift.report import backend_table

    weight = "model.layers.0.mlp.down_proj.weight"
    _say(f"6/7 (cont.) the whole model on ONNX Runtime, its deployed graph holding a wrong {weight}[3, 5]")
    _cmd(f"xray.drift(model, args, ['onnxrt-cpu'], '{out / 'drift'}', edits={{'onnxrt-cpu': onnx_weight_fault(...)}})")
    model, args = tiny_llama(layers=layers, hidden=hidden, seq=seq)
    result = xray.drift(model, args, ["onnxrt-cpu"], out / "drift", edits={"onnxrt-cpu": onnx_weight_fault(weight)})
    print(backend_table(result))
    b = result.backends[0]
    named = b.first_layer == weight.rsplit(".", 1)[0] and (b.first or {}).get("cause") == "parameter"
    print(f"the wrong weight is in {weight.rsplit('.', 1)[0]}: "
          + ("xray drift found it." if named else "xray drift did NOT name it (please report this)."))


def _verdict(result) -> str:
    """Compare's own one-line verdict (xray/compare/verdict.py): one sentence for the demo, the
    terminal, the summary JSON and the HTML."""
    return f"{result.summary.verdict_kind}: {result.summary.verdict}"


# The first divergence's fields as people read them, in this order; fields not named here
# follow under their own key. ``None`` values (not measured) are left out.
_DIVERGENCE_LABELS = {
    "op": "operator", "bench": "bench record", "target": "target record", "origin": "origin",
    "cause": "cause", "status": "status", "tensor": "tensor", "max_abs_err": "max abs error",
    "cosine": "cosine similarity", "bench_seq": "bench seq", "target_seq": "target seq", "target_op": "target operator",
    "rank": "rank", "index": "row in compare.csv", "layout": "layout note",
}


def divergence_table(first: dict | None) -> str:
    """The summary's first divergence as a two-column HTML table (a sentence when there is none)."""
    if not first:
        return "<p>None: every record agrees within tolerance.</p>"
    keys = [k for k in _DIVERGENCE_LABELS if k in first] + [k for k in first if k not in _DIVERGENCE_LABELS]
    rows = [f"<tr><th>{html.escape(_DIVERGENCE_LABELS.get(k, k))}</th><td><code>{html.escape(_cell(first[k]))}</code>"
            "</td></tr>" for k in keys if first[k] is not None and first[k] != ""]
    return '<table class="kv">' + "".join(rows) + "</table>"


def _cell(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):  # a nested detail (e.g. local and accumulated error): "key: value, ..."
        return ", ".join(f"{k}: {_cell(x)}" for k, x in v.items() if x is not None)
    return str(v)


def _write_index(path: Path, out: Path, artefacts, verdict: str, first: dict, failing: list[str]) -> None:
    rel = lambda p: html.escape(os.path.relpath(p, out))  # noqa: E731
    items = "\n".join(f'<li><a href="{rel(p)}">{html.escape(k)}</a> <code>{rel(p)}</code></li>' for k, p in artefacts)
    heat = next(iter(sorted((out / "replay").glob("*.png"))), None) if (out / "replay").exists() else None
    img = (f'<h2>Backend support</h2><a href="{rel(heat.with_suffix(".html"))}">'
           f'<img src="{rel(heat)}" style="max-width:100%"></a>') if heat else ""
    path.write_text(f"""<!doctype html><meta charset="utf-8"><title>xray demo</title>
<style>body{{font-family:system-ui,sans-serif;max-width:60em;margin:2em auto}}code{{color:#555}}
table.kv th{{text-align:left;padding-right:1em;font-weight:normal;color:#555}}</style>
<h1>xray demo</h1>
<h2>Verdict</h2><p>{html.escape(verdict)}</p>
<h2>First divergence</h2>{divergence_table(first)}
<p>Ops failing on the target device's op tests: <code>{html.escape(', '.join(failing) or 'none')}</code></p>
<p>The full compare report, with the error against execution order: <a href="compare.html">compare.html</a></p>
{img}
<h2>Artefacts</h2><ul>{items}</ul>
""", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(run_demo(Path(sys.argv[1] if len(sys.argv) > 1 else "xray-demo")))
