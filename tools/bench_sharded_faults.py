"""Sharded runs against a single-device run: on real transformers models, does ``xray-compare
single/ sharded/`` fail no row on a sound run, and name the op and the rank of a 1 % fault?

For each architecture (Llama, Qwen2 decoders, a BERT encoder: small configs, random weights, no
downloads), each layout (``tp``: DTensor ``parallelize_module``, q/k/v and the MLP's up/gate by
columns, o and down by rows; ``ddp``: ``DistributedDataParallel``; ``fsdp2``: ``fully_shard`` on
each layer and the root) and each world size, gloo ranks on CPU record one forward and backward
(``X_DEBUG=0x10A, X_DEDUP=False``, docs/distributed.md) of ``last_hidden_state.pow(2).mean()``,
and one process records the same weights on the whole batch (batch 4; tensor parallelism gives
every rank the whole batch, data parallelism splits it). Each sharded run is compared with the
single run (``xray.compare.compare_dumps``):

- clean: FAIL rows, and skipped rows by reason: those the docs say data parallelism cannot judge
  (each rank's backward is the gradient of its own batch), and the rest, which could be judged;
- faults: ``--faults`` random draws per case of a 1 % relative error on the output of one call on
  one rank (forward or backward, drawn evenly; a call is eligible when it is a plain ATen kernel
  that computes a float, non-zero result: no view, no in-place or out= call, no collective, no
  DTensor-level call, whose local kernel is the one corrupted). The fault is injected below the
  recorder (a dispatch mode entered first), as a broken kernel would be. The ground truth is read
  from the dumps: the first record of the faulty rank whose outputs differ from the clean run's.
  Graded ``exact`` (the first divergence is that record, or names it as its culprit, on that rank
  alone), ``module`` (the right module, another call or rank), ``wrong``, ``missed`` (no first
  divergence), or ``dropped`` (the faulty call is one the rebuilt run leaves out: a collective,
  FSDP2's data movement; not gradable).

    python tools/bench_sharded_faults.py [--archs llama,qwen2,bert] [--layouts tp,ddp,fsdp2]
        [--ranks 2,4] [--faults 2] [--seed 0] [--budget 600] [--out results.jsonl] [--work DIR]

Prints a table per arch x layout x ranks and the totals; ``--out`` writes one JSON line per run.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from xray.quiet import quiet_third_party  # noqa: E402

quiet_third_party()

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from tabulate import tabulate  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402

import xray  # noqa: E402
from accuracy.runner import _records  # noqa: E402  (a dump's records, the file closed)

BATCH, SEQ, VOCAB = 4, 16, 256
FAULT = 0.01
RECORDING = dict(X_DEBUG=0x10A, X_DEDUP=False)


# -- models ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Arch:
    """A transformers model built from a small config, and how tensor parallelism shards it."""

    build: Callable[[], torch.nn.Module]
    tp_plan: Callable[[int], dict[str, str]]  # layer count -> module path -> "col" | "row"
    layers: Callable[[torch.nn.Module], list[torch.nn.Module]]


def _llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaModel
    return LlamaModel(LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                                  use_cache=False, attn_implementation="sdpa"))


def _qwen2() -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2Model
    # grouped-query attention whose 4 kv heads split over 4 ranks
    return Qwen2Model(Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=64,
                                  use_cache=False, attn_implementation="sdpa"))


def _bert() -> torch.nn.Module:
    from transformers import BertConfig, BertModel
    # no pooler: its output is not in the loss, and DDP refuses parameters that get no gradient
    return BertModel(BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                intermediate_size=128, max_position_embeddings=64, attn_implementation="sdpa"),
                     add_pooling_layer=False)


def _decoder_plan(layers: int) -> dict[str, str]:
    plan = {}
    for i in range(layers):
        at = f"layers.{i}"
        plan.update({f"{at}.self_attn.q_proj": "col", f"{at}.self_attn.k_proj": "col", f"{at}.self_attn.v_proj": "col",
                     f"{at}.self_attn.o_proj": "row", f"{at}.mlp.gate_proj": "col", f"{at}.mlp.up_proj": "col",
                     f"{at}.mlp.down_proj": "row"})
    return plan


def _encoder_plan(layers: int) -> dict[str, str]:
    plan = {}
    for i in range(layers):
        at = f"encoder.layer.{i}"
        plan.update({f"{at}.attention.self.query": "col", f"{at}.attention.self.key": "col",
                     f"{at}.attention.self.value": "col", f"{at}.attention.output.dense": "row",
                     f"{at}.intermediate.dense": "col", f"{at}.output.dense": "row"})
    return plan


ARCHS = {
    "llama": Arch(_llama, _decoder_plan, lambda m: list(m.layers)),
    "qwen2": Arch(_qwen2, _decoder_plan, lambda m: list(m.layers)),
    "bert": Arch(_bert, _encoder_plan, lambda m: list(m.encoder.layer)),
}
LAYOUTS = ("tp", "ddp", "fsdp2")


def build_model(arch: str) -> torch.nn.Module:
    torch.manual_seed(0)  # every rank and the single run build the same weights
    return ARCHS[arch].build().eval()  # eval: no dropout, the runs must be comparable


def token_batch() -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))


def loss_of(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids).last_hidden_state.pow(2).mean()


def sharded_model(arch: str, layout: str, rank: int, world: int) -> tuple[torch.nn.Module, torch.Tensor]:
    """A freshly built model laid out for ``layout``, and this rank's input."""
    model, ids = build_model(arch), token_batch()
    if layout == "tp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
        n = len(ARCHS[arch].layers(model))
        plan = {k: ColwiseParallel() if v == "col" else RowwiseParallel() for k, v in ARCHS[arch].tp_plan(n).items()}
        parallelize_module(model, mesh, plan)
        return model, ids
    ids = ids.chunk(world)[rank]
    if layout == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        return DDP(model), ids
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    for layer in ARCHS[arch].layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, ids


# -- faults ----------------------------------------------------------------------------------------
def in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1


class FaultyCall(TorchDispatchMode):
    """Below the recorder: counts the eligible calls per direction, and returns the ``call``-th one
    of ``direction`` 1 % off (its first output). Eligible: a plain ATen kernel (no tensor subclass
    in the call: DTensor's local kernel, not the DTensor call) with tensor inputs, not a view, not
    in-place or out=, whose first output is a non-zero float tensor (1 % of zero is no fault)."""

    def __init__(self, direction: str | None = None, call: int = -1) -> None:
        super().__init__()
        self.direction, self.call = direction, call
        self.counts = {"forward": 0, "backward": 0}
        self.fired: dict | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        first = out[0] if isinstance(out, (tuple, list)) and out else out
        if not _eligible(func, types, args, kwargs, first):
            return out
        where = "backward" if in_backward() else "forward"
        index = self.counts[where]
        self.counts[where] += 1
        if where != self.direction or index != self.call:
            return out
        bad = first * (1 + FAULT)
        self.fired = {"op": str(func), "shape": list(first.shape), "direction": where, "call": index}
        return (bad, *out[1:]) if isinstance(out, (tuple, list)) else bad


def _eligible(func, types, args, kwargs, first: Any) -> bool:
    if types or func.namespace != "aten" or func.is_view or func._schema.is_mutable:
        return False
    if not isinstance(first, torch.Tensor) or not first.is_floating_point() or first.numel() == 0:
        return False
    if not any(isinstance(a, torch.Tensor) for a in tree_leaves((args, kwargs or {}))):
        return False  # a factory: nothing computed from the run's values
    return bool(first.detach().abs().max() > 0)


@dataclass
class Draw:
    rank: int
    direction: str
    call: int


def draw_faults(counts: list[dict[str, int]], n: int, rng: random.Random) -> list[Draw]:
    draws = []
    for _ in range(n):
        rank = rng.randrange(len(counts))
        direction = rng.choice(["forward", "backward"])
        draws.append(Draw(rank, direction, rng.randrange(counts[rank][direction])))
    return draws


# -- the ranks -------------------------------------------------------------------------------------
def record_step(arch: str, layout: str, rank: int, world: int, folder: Path, mode: FaultyCall) -> None:
    model, ids = sharded_model(arch, layout, rank, world)
    with mode:  # entered first: under the recorder, which records what the faulty kernel returned
        with xray.dump(dump_dir=folder, **RECORDING):
            loss_of(model, ids).backward()


def rank_main(rank: int, world: int, arch: str, layout: str, work: Path, faults: int, seed: int,
              deadline: float) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{work / 'store'}", rank=rank, world_size=world)
    try:
        counter = FaultyCall()
        record_step(arch, layout, rank, world, work / "clean", counter)
        counts: list[Any] = [None] * world
        dist.all_gather_object(counts, counter.counts)
        draws = draw_faults(counts, faults, random.Random(f"{seed}/{arch}/{layout}/{world}"))
        for i, d in enumerate(draws):
            go = [time.time() < deadline]
            dist.broadcast_object_list(go, src=0)  # every rank stops at the same draw
            if not go[0]:
                break
            mode = FaultyCall(d.direction, d.call) if d.rank == rank else FaultyCall()
            record_step(arch, layout, rank, world, work / f"fault{i}", mode)
            if d.rank == rank:
                (work / f"fault{i}.json").write_text(json.dumps({**asdict(d), "fired": mode.fired}))
            dist.barrier()
    finally:
        dist.destroy_process_group()


def run_ranks(arch: str, layout: str, world: int, work: Path, faults: int, seed: int, budget: float) -> str | None:
    """Spawn the ranks (forked: transformers imported once); None, or why they did not finish."""
    deadline = time.time() + budget
    ctx = mp.start_processes(rank_main, args=(world, arch, layout, work, faults, seed, deadline), nprocs=world,
                             start_method="fork", join=False)
    try:
        while not ctx.join(timeout=5):
            if time.time() > deadline + 120:  # the last draw began before the deadline: let it end
                return f"over the time budget ({budget:.0f} s)"
    except Exception as e:  # a rank raised: the layout does not run on this model
        return f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300] if str(e).strip() else ''}"
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    return None


# -- grading ---------------------------------------------------------------------------------------
def _outputs(rec) -> list:
    return [(n, tuple(m.shape), m.stats) for n, m in rec.output_tensors()]


@dataclass
class Truth:
    """Where the fault is in the rebuilt run: rank 0's record seq at the same logical position
    (the rebuilt record carries rank 0's seqs), its op and module; ``dropped`` when the faulty
    record is one the rebuilt run leaves out."""

    rank: str
    seq: int | None = None
    op: str | None = None
    module: str | None = None
    dropped: str | None = None


def _faulty_call(clean: Path, faulty: Path, before: list, after: list, first_changed, fired: dict | None):
    """The record of the corrupted call itself, where its statistics did not show it: the
    recorder takes a value-keeping op's statistics from its input (``_unsafe_view``), but saves
    its output, which does differ. The latest call of the fired op, direction and shape before
    the first record whose statistics changed, whose saved output differs from the clean run's."""
    if not fired:
        return None
    a, b = xray.load_dump(clean), xray.load_dump(faulty)
    try:
        for x, y in reversed([(x, y) for x, y in zip(before, after) if y.seq < first_changed.seq]):
            outs = list(y.output_tensors())
            if (y.op, y.direction) != (fired["op"], fired["direction"]) or not outs \
                    or list(outs[0][1].shape) != fired["shape"]:
                continue
            m, n = list(x.output_tensors())[0][1], outs[0][1]
            if m.data is not None and n.data is not None and not torch.equal(a.load_tensor(m), b.load_tensor(n)):
                return y
    finally:
        for d in (a, b):
            close = getattr(d, "close", None)
            if callable(close):
                close()
    return None


def fault_truth(clean: Path, faulty: Path, rank: int, fired: dict | None = None) -> Truth:
    from xray.compare.unshard import _logical

    label = f"rank_{rank}"
    before, after = _records(clean / label), _records(faulty / label)
    if [r.op for r in before] != [r.op for r in after]:
        raise RuntimeError(f"{faulty / label}: the faulty run ran other calls than the clean one")
    hit = next((b for a, b in zip(before, after) if a.kind == "op" and _outputs(a) != _outputs(b)), None)
    if hit is None:
        raise RuntimeError(f"{faulty / label}: no record differs from the clean run (the fault did not fire?)")
    hit = _faulty_call(clean / label, faulty / label, before, after, hit, fired) or hit
    kept, kernels = _logical(after)[:2]
    at = next((i for i, r in enumerate(kept) if r.seq == hit.seq or hit.seq in {k.seq for k in kernels.get(r.seq, [])}),
              None)
    if at is None:
        return Truth(label, op=hit.op, module=hit.module, dropped=f"{hit.op} #{hit.seq} is not in the rebuilt run")
    first = _logical(_records(faulty / "rank_0"))[0][at]
    return Truth(label, first.seq, kept[at].op, kept[at].module)


def grade(fd: dict | None, truth: Truth) -> str:
    from xray.compare.entry_table import normalize_path

    if truth.dropped:
        return "dropped"
    if not fd:
        return "missed"
    named = {fd.get("target_seq"), fd.get("culprit_target_seq")}
    if truth.seq in named and fd.get("rank") == truth.rank:
        return "exact"
    if normalize_path(fd.get("module")) == normalize_path(truth.module):
        return "module"
    return "wrong"


DESIGN_SKIP = "each rank's backward is the gradient of its own batch"  # docs/distributed.md, DDP and FSDP2


def skipped_by_reason(rows: list) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in rows:
        if r.status == "skip":
            key = f"{r.bench_op or r.target_op} {r.tensor}: {(r.note or '')[:90]}"
            out[key] = out.get(key, 0) + 1
    return out


def compare_case(single: Path, work: Path, meta: dict) -> list[dict]:
    from xray.compare import compare_dumps

    rows = []
    t0 = time.perf_counter()
    res = compare_dumps(single, work / "clean", progress=False)
    s = res.summary
    design = sum(1 for r in res.rows if r.status == "skip" and DESIGN_SKIP in (r.note or ""))
    rows.append({**meta, "run": "clean", "failed": s.failed, "nan_inf": s.nan_inf, "skipped": s.skipped,
                 "skipped_by_design": design, "skipped_judgeable": s.skipped - design, "unmatched": s.unmatched,
                 "matched": s.matched, "single_records": s.bench_records, "verdict": s.verdict,
                 "fail_rows": [f"{r.bench_name} {r.tensor}" for r in res.rows if r.status == "fail"][:10],
                 "skip_reasons": {k: v for k, v in skipped_by_reason(res.rows).items() if DESIGN_SKIP not in k},
                 "seconds": round(time.perf_counter() - t0, 1)})
    for spec in sorted(work.glob("fault*.json"), key=lambda p: int(p.stem[5:])):
        t0 = time.perf_counter()
        draw = json.loads(spec.read_text())
        try:
            truth = fault_truth(work / "clean", work / spec.stem, draw["rank"], draw.get("fired"))
        except RuntimeError as e:  # the scenario is broken, not xray: counted apart
            rows.append({**meta, "run": spec.stem, "draw": draw, "grade": "harness", "error": str(e)})
            continue
        fd = compare_dumps(single, work / spec.stem, progress=False).summary.first_divergence
        rows.append({**meta, "run": spec.stem, "draw": draw, "truth": asdict(truth), "grade": grade(fd, truth),
                     "named": fd and {k: fd.get(k) for k in ("op", "module", "rank", "target_seq", "culprit_target_seq", "origin", "status")},
                     "seconds": round(time.perf_counter() - t0, 1)})
    return rows


def record_single(arch: str, work: Path) -> Path:
    model, ids = build_model(arch), token_batch()
    with xray.dump(dump_dir=work / f"single-{arch}", **RECORDING) as d:
        loss_of(model, ids).backward()
    return Path(d.folder)


# -- report ----------------------------------------------------------------------------------------
def table(results: list[dict]) -> str:
    cases: dict[tuple, list[dict]] = {}
    for r in results:
        cases.setdefault((r["arch"], r["layout"], r["ranks"]), []).append(r)
    lines = []
    for (arch, layout, ranks), rs in cases.items():
        clean = next((r for r in rs if r["run"] == "clean"), None)
        if clean is None or "error" in clean:
            lines.append([arch, layout, ranks, "-", "-", "-", "-", (clean or rs[0]).get("error", "")[:70]])
            continue
        faults = [r for r in rs if r["run"] != "clean"]
        gradable = [r for r in faults if r["grade"] not in ("dropped", "harness")]
        other = ", ".join(f"{g} {sum(r['grade'] == g for r in faults)}" for g in ("module", "wrong", "missed", "dropped", "harness")
                          if any(r["grade"] == g for r in faults))
        lines.append([arch, layout, ranks, clean["failed"], clean["skipped_judgeable"], clean["skipped_by_design"],
                      f"{sum(r['grade'] == 'exact' for r in gradable)}/{len(gradable)}", other])
    return tabulate(lines, headers=["arch", "layout", "ranks", "clean FAIL rows", "skipped (judgeable)",
                                    "skipped (own-batch grads)", "faults exact", "other grades"])


def totals(results: list[dict]) -> str:
    clean = [r for r in results if r["run"] == "clean" and "error" not in r]
    faults = [r for r in results if r["run"] != "clean" and "grade" in r]
    gradable = [r for r in faults if r["grade"] not in ("dropped", "harness")]
    exact = [r for r in gradable if r["grade"] == "exact"]
    lines = [f"clean runs: {len(clean)}, with a FAIL row: {sum(r['failed'] > 0 for r in clean)}, FAIL rows: "
             f"{sum(r['failed'] for r in clean)}, judgeable rows skipped: {sum(r['skipped_judgeable'] for r in clean)}",
             f"faults: {len(faults)}, gradable {len(gradable)}, op and rank named exactly: {len(exact)} "
             f"({100.0 * len(exact) / max(len(gradable), 1):.1f} %)"]
    for d in ("forward", "backward"):
        g = [r for r in gradable if r["draw"]["direction"] == d]
        lines.append(f"  {d}: {sum(r['grade'] == 'exact' for r in g)}/{len(g)} exact")
    for r in results:
        if "error" in r:
            lines.append(f"not run: {r['arch']} {r['layout']} x{r['ranks']}: {r['error']}")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--archs", default=",".join(ARCHS))
    p.add_argument("--layouts", default=",".join(LAYOUTS))
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--faults", type=int, default=2, help="random fault draws per arch x layout x ranks")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget", type=float, default=600, help="seconds per arch x layout x ranks for the ranks' runs")
    p.add_argument("--out", type=Path, help="JSON lines, one per clean or faulty run")
    p.add_argument("--work", type=Path, help="where the dumps go (default: a temporary folder, removed)")
    a = p.parse_args()
    torch.set_num_threads(1)  # before forking: the ranks share 2 cores, and OpenMP pools do not survive fork
    work = a.work or Path(tempfile.mkdtemp(prefix="bench-sharded-"))
    work.mkdir(parents=True, exist_ok=True)
    results: list[dict] = []
    out = a.out.open("w") if a.out else None
    try:
        singles: dict[str, Path] = {}
        for world in (int(x) for x in a.ranks.split(",")):  # every case of 2 ranks before any of 4
            for arch in a.archs.split(","):
                if arch not in singles:
                    singles[arch] = record_single(arch, work)
                single = singles[arch]
                for layout in a.layouts.split(","):
                    case = work / f"{arch}-{layout}-{world}"
                    shutil.rmtree(case, ignore_errors=True)
                    case.mkdir(parents=True)
                    meta = {"arch": arch, "layout": layout, "ranks": world}
                    t0 = time.perf_counter()
                    error = run_ranks(arch, layout, world, case, a.faults, a.seed, a.budget)
                    rows = [{**meta, "run": "clean", "error": error}] if error and not (case / "clean").exists() \
                        else compare_case(single, case, meta)
                    if error and rows[0].get("error") is None:
                        rows[0]["note"] = error
                    for r in rows:
                        print(json.dumps(r, default=str)[:600], flush=True)
                        if out:
                            out.write(json.dumps(r, default=str) + "\n")
                            out.flush()
                    results += rows
                    print(f"-- {arch} {layout} x{world}: {time.perf_counter() - t0:.0f} s", flush=True)
    finally:
        if out:
            out.close()
        if a.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(table(results))
    print(totals(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
