"""Generated op tests judged against measured noise, on real models: self-check, other kernels, faults.

For each architecture (small transformers configs, random weights) and seed: record one forward
with every tensor saved, generate the suite with xray-gen, and run every generated test in
process, exactly as the pytest fixture does (``OpCheck``), on CPU:

* ``self``: the recording CPU itself; must pass 100%.
* ``decomp``: a different kernel for every op: the op re-run through torch's ATen
  decompositions (another summation order and formula, as torch.compile/export backends run
  it). Where no decomposition exists, the op is run on inputs with another memory layout.
  Its worst error in units of the CPU's noise is what ``K_NOISE`` must cover.
* ``threads1``: the CPU on one thread (another split of parallel reductions).
* faults: every test again with a 1e-3 relative error in its op's first output: the whole
  tensor, and 3 elements only (those of largest magnitude among the first quarter). Must fail.

    python tools/gen_selfcheck.py [--archs llama-sdpa,gpt2,...] [--seeds 0,1,2] [--dtype bfloat16]
                                  [--json out.json]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import xray
from xray.gen.generator import generate
from xray.gen.runtime import OpCheck, OpCheckFailed
from xray.demo.models import _quiet_import, tiny_llama, tiny_vit, token_batch
from xray.numerics.noise import K_NOISE

VOCAB = 256


def _tokens(seed: int, seq: int = 16) -> torch.Tensor:
    return token_batch(batch=2, seq=seq, vocab=VOCAB, seed=seed)


def _gpt2(seed: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=64, n_layer=2, n_head=4)
    return GPT2LMHeadModel(cfg).eval(), (_tokens(seed),), {}


def _bert(seed: int):
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=64)
    ids = _tokens(seed)
    mask = torch.ones_like(ids)
    mask[1, 12:] = 0  # padding: a real attention mask
    return BertModel(cfg).eval(), (ids,), {"attention_mask": mask}


def _t5(seed: int):
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(seed)
    cfg = T5Config(vocab_size=VOCAB, d_model=64, d_ff=128, d_kv=16, num_layers=2, num_decoder_layers=2,
                   num_heads=4, decoder_start_token_id=0)
    return T5ForConditionalGeneration(cfg).eval(), (_tokens(seed),), {"decoder_input_ids": _tokens(seed + 1, 8)}


def _qwen2(seed: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return Qwen2ForCausalLM(cfg).eval(), (_tokens(seed),), {}


def _llama(attn: str) -> Callable[[int], tuple]:
    def build(seed: int):
        return tiny_llama(layers=2, hidden=64, vocab=VOCAB, seed=seed, attn=attn), (_tokens(seed),), {}
    return build


def _vit(seed: int):
    g = torch.Generator().manual_seed(seed)
    return tiny_vit(seed=seed), (torch.randn(2, 3, 32, 32, generator=g),), {}


def _resnet(seed: int):
    """Batch norms, max pooling and residual adds: a generated batch norm calls F.batch_norm,
    so each device runs its own kernel (cudnn's on CUDA)."""
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(seed)
    cfg = ResNetConfig(num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic",
                       num_labels=10)
    g = torch.Generator().manual_seed(seed)
    return ResNetForImageClassification(cfg).eval(), (torch.randn(2, 3, 32, 32, generator=g),), {}


ARCHS: dict[str, Callable[[int], tuple]] = {
    "llama-sdpa": _llama("sdpa"), "llama-eager": _llama("eager"), "gpt2": _gpt2, "bert": _bert, "t5": _t5,
    "vit": _vit, "qwen2": _qwen2, "resnet": _resnet,
}


def record_and_generate(arch: str, seed: int, root: Path, dtype: torch.dtype = torch.float32) -> Path:
    """One forward of ``arch`` (weights and float inputs in ``dtype``) recorded with every tensor
    saved; its generated suite's folder."""
    with _quiet_import():
        model, args, kwargs = ARCHS[arch](seed)
    model = model.to(dtype)
    args = tuple(a.to(dtype) if a.is_floating_point() else a for a in args)
    with torch.no_grad(), xray.dump(dump_dir=root / f"{arch}-{seed}-dump", X_DEDUP=True, X_DUMP_NUM=1_000_000) as d:
        model(*args, **kwargs)
    folder = root / f"{arch}-{seed}"
    generate(xray.load_dump(d.folder), folder, factory="load", seed=seed)
    return folder


# -- running generated tests in process -------------------------------------------------------------

@dataclass
class Outcome:
    name: str
    op: str
    passed: bool
    row: dict = field(default_factory=dict)
    error: str = ""


def generated_tests(folder: Path) -> Iterator[tuple[str, Callable, Path]]:
    """(``file::test``, function, file) of every generated test in ``folder``."""
    for path in sorted(folder.glob("test_*.py")):
        spec = importlib.util.spec_from_file_location(f"xray_gen_{abs(hash(str(path)))}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        for name in sorted(n for n in vars(mod) if n.startswith("test_")):
            yield f"{path.name}::{name}", getattr(mod, name), path


def run_test(name: str, fn: Callable, path: Path, seed: int, mode: Any = None) -> Outcome:
    """Run one generated test as the pytest fixture would, under ``mode`` (a device emulation)."""
    rows: list[dict] = []
    check = OpCheck(name, path.parent, device="cpu", seed=seed, on_row=rows.append)
    try:
        with mode if mode is not None else nullcontext():
            fn(check)
        ok, err = True, ""
    except OpCheckFailed as e:
        ok, err = False, str(e)
    finally:
        check.close()
    row = rows[-1] if rows else {}
    return Outcome(name, row.get("op_name", ""), ok, row, err or row.get("error", ""))


# -- other kernels and faults (dispatch modes around the device run only) ----------------------------

def _split_k(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` as two half-length partial products added (a split-K GEMM, as GPUs run it)."""
    h = a.shape[-1] // 2
    if h == 0:
        return a @ b
    return a[..., :h] @ b[..., :h, :] + a[..., h:] @ b[..., h:, :]


def _split_sum(x: torch.Tensor, dims: list[int], keepdim: bool) -> torch.Tensor:
    """A sum over ``dims`` as the sum of two halves of the first of them (another order)."""
    d = dims[0] % x.dim()
    h = x.shape[d] // 2
    if h == 0:
        return x.sum(dims, keepdim=keepdim)
    return x.narrow(d, 0, h).sum(dims, keepdim=keepdim) + x.narrow(d, h, x.shape[d] - h).sum(dims, keepdim=keepdim)


class Decomposed(TorchDispatchMode):
    """Another device: each op computed another way at the same dtype. Matmuls split K in two
    (split-K GEMM), sums and means add two halves, convolutions run channels-last, everything
    else through torch's ATen decompositions (torch.compile/export's kernels) where one exists.
    Outputs a decomposition defines differently (SDPA's second output: attention weights, not
    logsumexp) come from the op itself."""

    def __init__(self) -> None:
        super().__init__()
        from torch._decomp import core_aten_decompositions, get_decompositions

        aten = torch.ops.aten
        self.table = {**core_aten_decompositions(),
                      **get_decompositions([aten._softmax, aten.native_layer_norm, aten.gelu, aten.silu])}
        self.custom = {
            aten.mm.default: lambda a, b: _split_k(a, b),
            aten.bmm.default: lambda a, b: _split_k(a, b),
            aten.addmm.default: lambda c, a, b, beta=1, alpha=1: beta * c + alpha * _split_k(a, b),
            aten.baddbmm.default: lambda c, a, b, beta=1, alpha=1: beta * c + alpha * _split_k(a, b),
            aten.sum.dim_IntList: lambda x, dims, keepdim=False, dtype=None: _split_sum(x, list(dims), keepdim),
            aten.mean.dim: lambda x, dims, keepdim=False, dtype=None: _split_sum(x, list(dims), keepdim)
            / math.prod(x.shape[d] for d in dims),
        }

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        real = func(*args, **kwargs)
        other = NotImplemented
        try:
            if func in self.custom and all(isinstance(a, torch.Tensor) and a.is_floating_point()
                                           for a in args if isinstance(a, torch.Tensor)):
                other = self.custom[func](*args, **kwargs)
            elif func is torch.ops.aten.convolution.default and args[0].dim() == 4:
                x = args[0].contiguous(memory_format=torch.channels_last)
                w = args[1].contiguous(memory_format=torch.channels_last)
                other = func(x, w, *args[2:], **kwargs)
            elif func in self.table:
                other = self.table[func](*args, **kwargs)
        except Exception:  # noqa: BLE001 - this call has no other way: the op itself
            other = NotImplemented
        if other is NotImplemented:
            return real
        return _keep_matching(real, other)


def _keep_matching(real: Any, other: Any) -> Any:
    """``other``'s tensors where they have ``real``'s shape and dtype, ``real``'s elsewhere."""
    if isinstance(real, torch.Tensor):
        ok = isinstance(other, torch.Tensor) and other.shape == real.shape and other.dtype == real.dtype
        if ok and real.data_ptr() != other.data_ptr():
            with torch.no_grad():
                real.copy_(other)  # in place: in-place ops and out= buffers carry it too
        return real
    if isinstance(real, (tuple, list)) and isinstance(other, (tuple, list)) and len(real) == len(other):
        return type(real)(_keep_matching(r, o) for r, o in zip(real, other))
    return real


@contextmanager
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class Corrupt(TorchDispatchMode):
    """A faulty kernel: the first floating output of ``op`` is off by ``rel`` relative, on every
    element or on ``elements`` elements only (the largest finite ones among the first quarter)."""

    def __init__(self, op: str, rel: float = 1e-3, elements: int | None = None) -> None:
        super().__init__()
        self.op, self.rel, self.elements, self.hit = op, rel, elements, False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if str(func) != self.op:
            return out
        first = out[0] if isinstance(out, (tuple, list)) else out
        if not isinstance(first, torch.Tensor) or not (first.is_floating_point() or first.is_complex()):
            return out
        if first.numel() == 0 or not bool(torch.isfinite(first).any()):
            return out
        flat = first.detach().reshape(-1)
        factor = torch.full_like(flat, 1.0 + self.rel)
        if self.elements is not None:
            head = flat[: max(self.elements, flat.numel() // 4)].abs()
            head = torch.where(torch.isfinite(head), head, torch.zeros_like(head))  # finite elements only
            factor = torch.ones_like(flat)
            factor[head.topk(min(self.elements, head.numel())).indices] = 1.0 + self.rel
        bad = (flat * factor).reshape(first.shape)
        self.hit = self.hit or not torch.equal(bad.to(first.dtype), first)  # 1e-3 of zeros is a no-op
        with torch.no_grad():
            first.copy_(bad.to(first.dtype))  # in place, so in-place and out= results carry it too
        return out


# -- the run ---------------------------------------------------------------------------------------

def check_suite(folder: Path, seed: int, faults: bool = True) -> dict:
    """Every test of one suite on every arm; returns counts and the worst noise multiples."""
    out = {"tests": 0, "self_fail": [], "decomp_fail": [], "threads1_fail": [], "self_worst": 0.0,
           "decomp_worst": 0.0, "threads1_worst": 0.0, "noise_level_max": 0.0,
           "fault_whole_missed": [], "fault_few_missed": [], "fault_tests": 0, "fault_noop": 0}
    decomp = Decomposed()
    for name, fn, path in generated_tests(folder):
        out["tests"] += 1
        res = run_test(name, fn, path, seed)
        if not res.passed:
            out["self_fail"].append(f"{name}: {res.error[:200]}")
        out["self_worst"] = max(out["self_worst"], _num(res.row.get("err_vs_noise")))
        lvl = _num(res.row.get("noise_level"))
        if res.row.get("dtype", "").startswith(("float", "bfloat")):
            out["noise_level_max"] = max(out["noise_level_max"], lvl)
        for arm, mode in (("decomp", decomp), ("threads1", one_thread())):
            r = run_test(name, fn, path, seed, mode)
            if not r.passed:
                out[f"{arm}_fail"].append(f"{name}: {r.error[:200]}")
            out[f"{arm}_worst"] = max(out[f"{arm}_worst"], _num(r.row.get("err_vs_noise")))
        if not faults or not res.row.get("dtype", "").startswith(("float", "bfloat", "complex")):
            continue
        out["fault_tests"] += 1
        for key, elements in (("fault_whole_missed", None), ("fault_few_missed", 3)):
            mode = Corrupt(res.op, 1e-3, elements)
            r = run_test(name, fn, path, seed, mode)
            if not mode.hit:
                out["fault_noop"] += 1
            elif r.passed:
                out[key].append(f"{name} (err_vs_noise {r.row.get('err_vs_noise')})")
    return out


def _num(text: Any) -> float:
    try:
        v = float(text)
    except (TypeError, ValueError):
        return 0.0
    return 0.0 if math.isnan(v) else v


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--archs", default=",".join(ARCHS))
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--no-faults", action="store_true")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="the models' weights and float inputs")
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    torch.set_num_threads(2)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for arch in a.archs.split(","):
            for seed in (int(s) for s in a.seeds.split(",")):
                t0 = time.perf_counter()
                folder = record_and_generate(arch, seed, Path(tmp), getattr(torch, a.dtype))
                r = check_suite(folder, seed, faults=not a.no_faults)
                r["seconds"] = round(time.perf_counter() - t0, 1)
                results[f"{arch}/{seed}"] = r
                print(f"{arch:12s} seed {seed}: {r['tests']:3d} tests, self fail {len(r['self_fail'])}, "
                      f"worst x noise: self {r['self_worst']:.2f} decomp {r['decomp_worst']:.2f} "
                      f"(fail {len(r['decomp_fail'])}) threads1 {r['threads1_worst']:.2f} "
                      f"(fail {len(r['threads1_fail'])}); max noise level {r['noise_level_max']:.2e}; "
                      f"1e-3 faults missed: whole {len(r['fault_whole_missed'])}, "
                      f"3 elements {len(r['fault_few_missed'])} of {r['fault_tests']}; {r['seconds']} s", flush=True)
                for key in ("self_fail", "decomp_fail", "threads1_fail", "fault_whole_missed", "fault_few_missed"):
                    for line in r[key][:6]:
                        print(f"    {key}: {line}")
    tests = sum(r["tests"] for r in results.values())
    print(f"total: {tests} tests in {len(results)} suites; self failures "
          f"{sum(len(r['self_fail']) for r in results.values())}; K_NOISE {K_NOISE:g}; worst x noise: decomp "
          f"{max(r['decomp_worst'] for r in results.values()):.2f}, threads1 "
          f"{max(r['threads1_worst'] for r in results.values()):.2f}; faults missed whole "
          f"{sum(len(r['fault_whole_missed']) for r in results.values())}, few "
          f"{sum(len(r['fault_few_missed']) for r in results.values())} of "
          f"{sum(r['fault_tests'] for r in results.values())} (x2 runs; "
          f"{sum(r['fault_noop'] for r in results.values())} runs changed nothing: zeros, non-finite values)")
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))
    return 0 if all(not r["self_fail"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
