"""Compiler faults injected into inductor, on real transformers models with random weights: does
``xray compile-check`` name the kernel that computes the fault, and do clean compiles give 0 FAIL?

Faults (xray/compiled/faults.py): a post-grad pass scaling one node's value by 1+1e-2 or 1+1e-3
(``post_grad_custom_post_pass``), and one op decomposed wrongly (GELU's tanh approximation,
SiLU of 1.01x, rsqrt 0.1 % high). Graded strictly: a scale fault is *named* when the first
divergence is at the very launch that first computes the scaled value (the first launch, in call
order, whose computed nodes hold ``xray_fault``: a fallback kernel computes only its own op) and
names that node among the kernel's; a decomposition fault when it is at the first launch that
computes the wrongly decomposed op, named among its ops. *Detected* means at least one FAIL row;
a fault whose effect vanishes (a scale before a normalisation) is counted but cannot be detected.

    python tools/bench_compile_faults.py [--faults 4] [--real] [--out bench-compile]

Prints one row per check and the totals, and writes OUT/results.json.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from xray.quiet import quiet_third_party  # noqa: E402

quiet_third_party()


def _llama(hidden=64, layers=2, seq=32, inter=None, heads=4):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=hidden, intermediate_size=inter or 2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=max(seq, 64),
                      use_cache=False, attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).eval(), (torch.randint(0, 256, (1, seq), generator=torch.Generator().manual_seed(0)),)


def _qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, use_cache=False, attn_implementation="sdpa")
    return Qwen2ForCausalLM(cfg).eval(), (torch.randint(0, 256, (1, 32), generator=torch.Generator().manual_seed(1)),)


def _bert():
    from transformers import BertConfig, BertModel
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                     attn_implementation="sdpa")
    return BertModel(cfg).eval(), (torch.randint(0, 256, (1, 32), generator=torch.Generator().manual_seed(2)),)


def _vit():
    from xray.drift.examples import tiny_vit
    return tiny_vit()


def _resnet():
    from transformers import ResNetConfig, ResNetForImageClassification
    torch.manual_seed(0)
    cfg = ResNetConfig(num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], num_labels=10)
    return ResNetForImageClassification(cfg).eval(), (torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(3)),)


MODELS = {"llama": (_llama, "silu"), "qwen2": (_qwen2, "silu"), "bert": (_bert, "gelu"), "vit": (_vit, "gelu"),
          "resnet": (_resnet, "rsqrt")}


def _row(model: str, fault: str, r, seconds: float, named: bool | None) -> dict:
    fd = r.first or {}
    return {"model": model, "fault": fault, "failed": r.summary.get("failed"), "passed": r.summary.get("passed"),
            "warned": r.summary.get("warned"), "detected": (r.summary.get("failed") or 0) > 0, "named": named,
            "kernel": fd.get("kernel"), "node": fd.get("node"), "op": fd.get("op"), "module": fd.get("module"),
            "verdict": r.verdict, "kernels": r.kernels, "paired": r.paired, "outputs_equal": r.outputs_equal,
            "eager_equal": r.eager_equal, "seconds": round(seconds, 1),
            "timing": {k: round(v, 4) for k, v in r.seconds.items()}}


def run(models: list[str], faults: int, out: Path, real: bool) -> list[dict]:
    from xray.compiled import compile_check
    from xray.compiled.faults import FAULT_NODE, WRONG, ScaleNode, wrong_decompositions

    rows = []
    todo = [(m, *MODELS[m]) for m in models]
    if real:
        todo.append(("llama-1024x512", lambda: _llama(hidden=1024, layers=1, seq=512, inter=2816, heads=16), "silu"))
    for name, build, decomp in todo:
        model, args = build()
        checks = [("clean", {}, None)]
        for i in range(faults):
            eps = 1e-2 if i % 2 == 0 else 1e-3
            checks.append((f"scale#{7 * i + 3}x(1+{eps:g})", {"post_grad_custom_post_pass": ScaleNode(7 * i + 3, eps)}, None))
        checks.append((f"decomp:{decomp}", {}, decomp))
        checks.append(("clean-bf16", {}, None))
        for label, patches, dec in checks:
            t0 = time.perf_counter()
            m, a = model, args
            if label == "clean-bf16":  # inductor keeps fused intermediates in fp32, eager rounds every op
                m = copy.deepcopy(model).to(torch.bfloat16)
                a = tuple(x.to(torch.bfloat16) if x.is_floating_point() else x for x in args)
            r = compile_check(m, a, out=out / "runs" / name, config_patches=patches,
                              decompositions=wrong_decompositions(dec) if dec else None)
            fd = r.first or {}
            kernels = json.loads((r.out / "compiled" / "dump.json").read_text())["compiled"]["kernels"]
            if label.startswith("clean"):
                named, at = None, None
            elif dec:
                op = str(WRONG[dec][0])
                at = next((k for k in kernels if op in k["ops"]), None)
                named = at is not None and (fd.get("graph"), fd.get("launch")) == (at["graph"], at["launch"]) \
                    and op in (fd.get("kernel_ops") or [])
            else:
                at = next((k for k in kernels if FAULT_NODE in k["nodes"]), None)
                named = at is not None and (fd.get("graph"), fd.get("launch")) == (at["graph"], at["launch"]) \
                    and FAULT_NODE in (fd.get("kernel_nodes") or [])
            row = _row(name, label, r, time.perf_counter() - t0, named)
            row["expected_kernel"] = at and f"{at['kernel']} (launch {at['launch']})"
            if not dec and patches:
                row["fault_node"], row["fault_op"] = patches["post_grad_custom_post_pass"].hit, \
                    patches["post_grad_custom_post_pass"].hit_op
            rows.append(row)
            print(f"{name:15s} {label:22s} fail={row['failed']:<3} named={str(named):5s} kernel={row['kernel']} "
                  f"(launch {fd.get('launch')}) node={row['node']} expected={row['expected_kernel']} "
                  f"fault={row.get('fault_node', '')}/{row.get('fault_op', '')} verdict={r.verdict[:60]!r} "
                  f"({row['seconds']} s)", flush=True)
            (out / "results.json").write_text(json.dumps(rows, indent=1))
    return rows


def totals(rows: list[dict]) -> str:
    clean = [r for r in rows if r["fault"] == "clean"]
    bf16 = [r for r in rows if r["fault"] == "clean-bf16"]
    faulty = [r for r in rows if not r["fault"].startswith("clean")]
    born = [r for r in faulty if r["named"] and r["verdict"].startswith("bug: born at")]
    detected = [r for r in faulty if r["detected"]]
    named = [r for r in faulty if r["named"]]
    named_detected = [r for r in detected if r["named"]]
    pct = lambda a, b: f"{100.0 * len(a) / len(b):.0f}%" if b else "n/a"  # noqa: E731
    lines = [f"clean bf16 compiles: {len(bf16)}, FAIL rows: {sum(r['failed'] or 0 for r in bf16)}",
             f"faults named with a 'bug: born at' verdict: {len(born)} of {len(faulty)}",
             f"clean compiles: {len(clean)}, FAIL rows: {sum(r['failed'] or 0 for r in clean)}, "
             f"outputs unchanged by recording: {sum(r['outputs_equal'] for r in rows)}/{len(rows)}",
             f"faults: {len(faulty)}, detected (a FAIL row): {len(detected)}, kernel+node named: {len(named)} "
             f"({pct(named, faulty)} of all, {pct(named_detected, detected)} of detected)"]
    for r in clean:
        t = r["timing"]
        lines.append(f"  {r['model']}: compiled run {t.get('compiled_run', 0) * 1e3:.1f} ms, recorded run "
                     f"{t.get('recorded_run', 0) * 1e3:.1f} ms ({t.get('recorded_run', 0) / max(t.get('compiled_run', 1e-9), 1e-9):.1f}x, "
                     f"tensors copied), {r['kernels']} launches, {r['paired']} paired")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated: " + ",".join(MODELS))
    p.add_argument("--faults", type=int, default=4, help="scale faults per model (half 1e-2, half 1e-3)")
    p.add_argument("--real", action="store_true", help="also a 1-layer Llama, hidden 1024, 512 tokens")
    p.add_argument("--out", default="bench-compile")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = run([m for m in a.models.split(",") if m], a.faults, out, a.real)
    print(totals(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
