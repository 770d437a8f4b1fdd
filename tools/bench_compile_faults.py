"""Compiler faults injected into inductor, on real architectures with random weights, forward and
backward: does ``xray compile-check`` name the kernel that computes the fault, and do clean compiles
(fp32 and bf16) give 0 FAIL rows?

Models (transformers configs or their own classes, random weights, no download, 1 layer/stage):
Llama, Qwen2, GPT-2 (decoders), BERT (encoder), ViT, ResNet (CNN). Every check compiles with
``backward=True``: the forward and AOT autograd's backward graphs are both probed and compared.

Faults (xray/compiled/faults.py), each model: a post-grad pass scaling one node's value by
1+1e-2 or 1+1e-3 in the forward graph, the same in the backward graph (``ScaleNode``), one op
decomposed wrongly (``wrong_decompositions``), one op lowered wrongly (``wrong_lowering``, 1e-3).
Graded strictly: a scale fault is *named* when the first divergence is at the very launch that
first computes the scaled value (the first launch, in call order, whose computed nodes hold
``xray_fault``) and names that node among the kernel's; a decomposition fault when it is at the
first launch that computes the wrongly decomposed op, named among its ops; a lowering fault when
it is at the first launch computing a node of the op. *Detected* means at least one FAIL row.

    python tools/bench_compile_faults.py [--models llama,bert] [--scales 1] [--out bench-compile]

Prints one row per check and the totals, and writes OUT/results.json (rewritten after each row).
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


def _llama(hidden=64, layers=1, seq=32, inter=None, heads=4):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=hidden, intermediate_size=inter or 2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=max(seq, 64),
                      use_cache=False, attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).eval(), (torch.randint(0, 256, (1, seq), generator=torch.Generator().manual_seed(0)),)


def _qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, use_cache=False, attn_implementation="sdpa")
    return Qwen2ForCausalLM(cfg).eval(), (torch.randint(0, 256, (1, 32), generator=torch.Generator().manual_seed(1)),)


def _bert():
    from transformers import BertConfig, BertModel
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=256, hidden_size=64, num_hidden_layers=1, num_attention_heads=2, intermediate_size=128,
                     attn_implementation="sdpa")
    return BertModel(cfg).eval(), (torch.randint(0, 256, (1, 32), generator=torch.Generator().manual_seed(2)),)


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=1, n_head=4, attn_implementation="sdpa")
    return GPT2LMHeadModel(cfg).eval(), (torch.randint(0, 256, (1, 32), generator=torch.Generator().manual_seed(4)),)


def _vit():
    from xray.drift.examples import tiny_vit
    return tiny_vit()


def _resnet():
    from transformers import ResNetConfig, ResNetForImageClassification
    torch.manual_seed(0)
    cfg = ResNetConfig(num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], num_labels=10)
    return ResNetForImageClassification(cfg).eval(), (torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(3)),)


aten = torch.ops.aten
# model -> (builder, op decomposed wrongly, op lowered wrongly)
MODELS = {"llama": (_llama, "silu", aten.rsqrt.default), "qwen2": (_qwen2, "silu", aten.sigmoid.default),
          "gpt2": (_gpt2, "tanh", aten.rsqrt.default), "bert": (_bert, "gelu", aten.tanh.default),
          "vit": (_vit, "gelu", aten.erf.default), "resnet": (_resnet, "relu", aten.relu.default)}


def _row(model: str, fault: str, r, seconds: float, named: bool | None) -> dict:
    fd = r.first or {}
    return {"model": model, "fault": fault, "failed": r.summary.get("failed"), "passed": r.summary.get("passed"),
            "warned": r.summary.get("warned"), "detected": (r.summary.get("failed") or 0) > 0, "named": named,
            "kernel": fd.get("kernel"), "node": fd.get("node"), "op": fd.get("op"), "module": fd.get("module"),
            "verdict": r.verdict, "kernels": r.kernels, "paired": r.paired, "outputs_equal": r.outputs_equal,
            "eager_equal": r.eager_equal, "seconds": round(seconds, 1),
            "timing": {k: round(v, 4) for k, v in r.seconds.items()}}


def _expected(kernels: list[dict], label: str, dec: str | None, low) -> tuple[dict | None, str]:
    """The launch a fault must be named at, and what of it must be named (node, op or target)."""
    from xray.compiled.faults import FAULT_NODE, WRONG

    if dec:
        op = str(WRONG[dec][0])
        return next((k for k in kernels if op in k["ops"]), None), op
    if low is not None:
        op = str(low)
        return next((k for k in kernels if op in k["targets"]), None), op
    return next((k for k in kernels if FAULT_NODE in k["nodes"]), None), FAULT_NODE


def _named(fd: dict, at: dict | None, what: str) -> bool:
    if at is None or (fd.get("graph"), fd.get("launch")) != (at["graph"], at["launch"]):
        return False
    return what in (fd.get("kernel_nodes") or []) or what in (fd.get("kernel_ops") or []) or what in at["targets"]


def checks(index: int, scales: int, decomp: str, low) -> list[tuple]:
    """(label, config patches, wrong decomposition, wrong lowering) for one model."""
    from xray.compiled.faults import ScaleNode

    out = [("clean", {}, None, None)]
    for backward in (False, True):
        for i in range(scales):
            eps = 1e-2 if (index + i + backward) % 2 == 0 else 1e-3
            at = 7 * i + 3
            label = f"{'bwd' if backward else 'fwd'}-scale#{at}x(1+{eps:g})"
            out.append((label, {"post_grad_custom_post_pass": ScaleNode(at, eps, backward=backward)}, None, None))
    out += [(f"decomp:{decomp}", {}, decomp, None), (f"lowering:{low._opname}", {}, None, low),
            ("clean-bf16", {}, None, None)]
    return out


def run(models: list[str], scales: int, out: Path, real: bool) -> list[dict]:
    import contextlib

    from xray.compiled import compile_check
    from xray.compiled.faults import wrong_decompositions, wrong_lowering

    rows = []
    todo = [(m, *MODELS[m]) for m in models]
    if real:
        todo.append(("llama-1024x512", lambda: _llama(hidden=1024, layers=1, seq=512, inter=2816, heads=16), "silu",
                     aten.rsqrt.default))
    for index, (name, build, decomp, low) in enumerate(todo):
        model, args = build()
        for label, patches, dec, lowered in checks(index, scales, decomp, low):
            t0 = time.perf_counter()
            m, a = model, args
            if label == "clean-bf16":  # inductor keeps fused intermediates in fp32, eager rounds every op
                m = copy.deepcopy(model).to(torch.bfloat16)
                a = tuple(x.to(torch.bfloat16) if x.is_floating_point() else x for x in args)
            applied = [1]
            with (wrong_lowering(lowered) if lowered is not None else contextlib.nullcontext()) as hits:
                r = compile_check(m, a, out=out / "runs" / name, config_patches=patches, backward=True,
                                  decompositions=wrong_decompositions(dec) if dec else None)
                applied = hits if hits is not None else applied
            fd = r.first or {}
            kernels = json.loads((r.out / "compiled" / "dump.json").read_text())["compiled"]["kernels"]
            at, what = _expected(kernels, label, dec, lowered) if not label.startswith("clean") else (None, "")
            named = None if label.startswith("clean") else _named(fd, at, what)
            row = _row(name, label, r, time.perf_counter() - t0, named)
            row["expected_kernel"] = at and f"{at['kernel']} (graph {at['graph']}, launch {at['launch']})"
            row["backward_fault"] = bool(at and at.get("backward"))
            row["applied"] = bool(applied[0]) and (at is not None or label.startswith("clean"))
            if "post_grad_custom_post_pass" in patches:
                row["fault_node"], row["fault_op"] = patches["post_grad_custom_post_pass"].hit, \
                    patches["post_grad_custom_post_pass"].hit_op
            rows.append(row)
            print(f"{name:8s} {label:24s} fail={row['failed']:<3} named={str(named):5s} kernel={row['kernel']} "
                  f"(graph {fd.get('graph')}, launch {fd.get('launch')}) node={row['node']} "
                  f"expected={row['expected_kernel']} fault={row.get('fault_node', '')}/{row.get('fault_op', '')} "
                  f"verdict={r.verdict[:70]!r} ({row['seconds']} s)", flush=True)
            (out / "results.json").write_text(json.dumps(rows, indent=1))
    return rows


def totals(rows: list[dict]) -> str:
    clean = [r for r in rows if r["fault"] == "clean"]
    bf16 = [r for r in rows if r["fault"] == "clean-bf16"]
    faulty = [r for r in rows if not r["fault"].startswith("clean") and r.get("applied", True)]
    unapplied = [f"{r['model']}:{r['fault']}" for r in rows if not r["fault"].startswith("clean") and not r.get("applied", True)]
    born = [r for r in faulty if r["named"] and r["verdict"].startswith("bug: born at")]
    detected = [r for r in faulty if r["detected"]]
    named = [r for r in faulty if r["named"]]
    named_detected = [r for r in detected if r["named"]]
    pct = lambda a, b: f"{100.0 * len(a) / len(b):.0f}%" if b else "n/a"  # noqa: E731
    lines = [f"faults not applied (the op never reached the compiler's graph): {', '.join(unapplied) or 'none'}",
             f"clean bf16 compiles: {len(bf16)}, FAIL rows: {sum(r['failed'] or 0 for r in bf16)}",
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
    p.add_argument("--scales", type=int, default=1, help="scale faults per model and direction (1e-2 and 1e-3 alternate)")
    p.add_argument("--real", action="store_true", help="also a 1-layer Llama, hidden 1024, 512 tokens")
    p.add_argument("--out", default="bench-compile")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = run([m for m in a.models.split(",") if m], a.scales, out, a.real)
    print(totals(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
