"""Two gloo ranks on CPU record sharded runs of a small attention + MLP block, forward and
backward (tests/test_record_sharded.py, tests/test_cross_rank.py).

    python sharded_run.py OUT [--hidden H] [--cases tp,funcol,funcol_fault] [--world 2]

Each case writes ``OUT/<case>/rank_<r>/`` and ``OUT/<case>.rank<r>.json``: whether recording
left the outputs and gradients bitwise identical, and the records written. The ranks are forked
from this process (torch imported once), and meet through a file store.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

import xray


class Block(nn.Module):
    """Attention + MLP, the layout tensor parallelism shards (q/k/v/up by columns, o/down by rows)."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(hidden, hidden) for _ in range(4))
        self.up, self.down = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape

        def split(t: torch.Tensor) -> torch.Tensor:  # -1 heads: a TP rank holds heads / world of them
            return t.view(b, s, -1, x.shape[-1] // self.heads).transpose(1, 2)

        a = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)))
        x = x + self.o(a.transpose(1, 2).reshape(b, s, -1))
        return x + self.down(F.gelu(self.up(x)))


def tp_case(out: Path, rank: int, hidden: int, fault: bool = False) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    torch.manual_seed(0)
    model = Block(hidden, heads=4)
    plan = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "o": RowwiseParallel(),
            "up": ColwiseParallel(), "down": RowwiseParallel()}
    parallelize_module(model, mesh, plan)
    x = torch.randn(2, 8, hidden, generator=torch.Generator().manual_seed(1))

    def step() -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        y = model(x)
        (y * y).mean().backward()
        return [y.detach().clone()] + [p.grad.to_local().clone() for p in model.parameters()]

    expected = step()
    faulty = AlterAllReduce() if fault and rank == 1 else None
    if faulty is not None:
        faulty.__enter__()  # below the recorder: the record holds what the rank got
    try:
        with xray.dump(dump_dir=out / ("tp_fault" if fault else "tp"), X_DEBUG=0x10A, X_DEDUP=False):
            got = step()
    finally:
        if faulty is not None:
            faulty.__exit__(None, None, None)
    return {"bitwise": fault or all(torch.equal(a, b) for a, b in zip(expected, got))}


class AlterAllReduce(torch.utils._python_dispatch.TorchDispatchMode):
    """A faulty reduction on one rank: its all-reduce results come back 1 % off."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops._c10d_functional.all_reduce.default:
            torch.ops._c10d_functional.wait_tensor.default(out)
            out.mul_(1.01)
        return out


def funcol_case(out: Path, rank: int, hidden: int, fault: bool = False) -> dict:
    import torch.distributed._functional_collectives as funcol

    world = dist.get_world_size()
    x = torch.randn(4, hidden, generator=torch.Generator().manual_seed(10 + rank))
    name = "funcol_fault" if fault else "funcol"

    def run() -> torch.Tensor:
        if rank == 1:  # rank 0's all-reduce waits for this rank's term: its tensor holds its own until then
            time.sleep(0.3)
        s = funcol.all_reduce(x, "sum", dist.group.WORLD)
        g = funcol.all_gather_single(torch.tanh(s[rank * (4 // world):(rank + 1) * (4 // world)]), 0, dist.group.WORLD)
        b = x.clone()
        dist.broadcast(b, src=0)
        return torch.relu(s) * 2 + g.sum() + b

    expected = run()
    faulty = AlterAllReduce() if fault and rank == 1 else None
    if faulty is not None:
        faulty.__enter__()  # below the recorder
    try:
        with xray.dump(dump_dir=out / name, X_DEDUP=False):
            got = run()
    finally:
        if faulty is not None:
            faulty.__exit__(None, None, None)
    sums = [torch.zeros_like(x) for _ in range(world)]
    dist.all_gather(sums, x)
    torch.save(torch.stack(sums).sum(0), out / f"{name}.sum.rank{rank}.pt")  # the true all-reduce, for the test
    return {"bitwise": fault or torch.equal(expected, got)}


class AlterLocalKernel(torch.utils._python_dispatch.TorchDispatchMode):
    """A faulty kernel on one rank: the forward local ``addmm`` whose output has ``columns``
    columns (a column-parallel Linear's shard) comes back 1 % off, once."""

    def __init__(self, columns: int) -> None:
        super().__init__()
        self.columns, self.done = columns, False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if (not self.done and func is torch.ops.aten.addmm.default and not types and out.shape[-1] == self.columns
                and torch._C._current_graph_task_id() == -1):
            self.done = True
            out.mul_(1.01)
        return out


class Positioned(nn.Module):
    """A Block after a learned position table, read with no batch dimension: under data
    parallelism every rank computes its rows alike."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.table = nn.Embedding(8, hidden)
        self.block = Block(hidden, heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x + self.table(torch.arange(x.shape[1])))


class AlterEmbedding(torch.utils._python_dispatch.TorchDispatchMode):
    """A faulty kernel on one rank: every ``embedding`` comes back 1 % off."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        return out * 1.01 if func is torch.ops.aten.embedding.default else out


def single_case(out: Path, rank: int, hidden: int, batch: int = 2, name: str = "single", model_cls=None) -> dict:
    """The same block on one device, whole (rank 0 only: the others wait)."""
    if rank == 0:
        torch.manual_seed(0)
        model = (model_cls or Block)(hidden, heads=4)
        x = torch.randn(batch, 8, hidden, generator=torch.Generator().manual_seed(1))
        with xray.dump(dump_dir=out / name, X_DEBUG=0x10A, X_DEDUP=False):
            (model(x) ** 2).mean().backward()
    return {"bitwise": True}


def tp_step_case(out: Path, rank: int, hidden: int, fault: bool = False) -> dict:
    """Tensor parallelism, the step of ``single_case``; with ``fault``, rank 1's shard of the up
    projection 1 % off."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    torch.manual_seed(0)
    model = Block(hidden, heads=4)
    plan = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "o": RowwiseParallel(),
            "up": ColwiseParallel(), "down": RowwiseParallel()}
    parallelize_module(model, mesh, plan)
    x = torch.randn(2, 8, hidden, generator=torch.Generator().manual_seed(1))
    faulty = AlterLocalKernel(4 * hidden // dist.get_world_size()) if fault and rank == 1 else None
    if faulty is not None:
        faulty.__enter__()  # below the recorder
    try:
        with xray.dump(dump_dir=out / ("tp_bug" if fault else "tp_step"), X_DEBUG=0x10A, X_DEDUP=False):
            (model(x) ** 2).mean().backward()
    finally:
        if faulty is not None:
            faulty.__exit__(None, None, None)
    return {"bitwise": True}


class AlterSeed(torch.utils._python_dispatch.TorchDispatchMode):
    """A faulty kernel on one rank: the ``ones_like`` that seeds the backward comes back 1 % off."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        return out * 1.01 if func is torch.ops.aten.ones_like.default else out


def ddp_case(out: Path, rank: int, hidden: int, fault: bool = False, seed_fault: bool = False,
             position_fault: bool = False) -> dict:
    """DDP: each rank runs its half of a batch of 4; the gradients are averaged. ``fault``:
    rank 1's forward ``up`` matmul 1 % off; ``seed_fault``: rank 1's backward seed 1 % off;
    ``position_fault``: a Positioned block, rank 1's position rows 1 % off."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    world = dist.get_world_size()
    torch.manual_seed(0)
    model = DDP((Positioned if position_fault else Block)(hidden, heads=4))
    x = torch.randn(2 * world, 8, hidden, generator=torch.Generator().manual_seed(1)).chunk(world)[rank]
    faulty = (AlterLocalKernel(4 * hidden) if fault else AlterSeed() if seed_fault
              else AlterEmbedding() if position_fault else None) if rank == 1 else None
    if faulty is not None:
        faulty.__enter__()
    name = "ddp_bug" if fault else "ddp_seed_bug" if seed_fault else "ddp_pos_bug" if position_fault else "ddp"
    try:
        with xray.dump(dump_dir=out / name, X_DEBUG=0x10A, X_DEDUP=False):
            (model(x) ** 2).mean().backward()
    finally:
        if faulty is not None:
            faulty.__exit__(None, None, None)
    return {"bitwise": True}


def fsdp_case(out: Path, rank: int, hidden: int, fault: bool = False) -> dict:
    """FSDP2 (``fully_shard`` on each Linear and the block): each rank runs its half of a batch of
    4; parameters are all-gathered for the forward and backward, gradients reduce-scattered into
    S(0) shards. With ``fault``, rank 1's forward ``up`` matmul 1 % off."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    model = Block(hidden, heads=4)
    for m in (model.q, model.k, model.v, model.o, model.up, model.down):
        fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    x = torch.randn(2 * world, 8, hidden, generator=torch.Generator().manual_seed(1)).chunk(world)[rank]
    faulty = AlterLocalKernel(4 * hidden) if fault and rank == 1 else None
    if faulty is not None:
        faulty.__enter__()
    try:
        with xray.dump(dump_dir=out / ("fsdp_bug" if fault else "fsdp"), X_DEBUG=0x10A, X_DEDUP=False):
            (model(x) ** 2).mean().backward()
    finally:
        if faulty is not None:
            faulty.__exit__(None, None, None)
    return {"bitwise": True}


def tiny_llama(hidden: int) -> nn.Module:
    """A transformers Llama (2 layers, random weights, built alike on every rank from one seed)."""
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(0)
    return LlamaModel(LlamaConfig(vocab_size=128, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32,
                                  use_cache=False, attn_implementation="sdpa")).eval()


def llama_tokens() -> torch.Tensor:
    return torch.randint(0, 128, (4, 8), generator=torch.Generator().manual_seed(1))


def llama_single_case(out: Path, rank: int, hidden: int) -> dict:
    if rank == 0:
        with xray.dump(dump_dir=out / "llama_single", X_DEBUG=0x10A, X_DEDUP=False):
            tiny_llama(hidden)(input_ids=llama_tokens()).last_hidden_state.pow(2).mean().backward()
    return {"bitwise": True}


class AlterNorm(torch.utils._python_dispatch.TorchDispatchMode):
    """A faulty kernel on one rank: the third forward ``rsqrt`` (an RMS norm every rank computes
    alike under tensor parallelism) comes back 1 % off."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.rsqrt.default and not types and torch._C._current_graph_task_id() == -1:
            self.calls += 1
            if self.calls == 3:
                out = out * 1.01
        return out


def llama_tp_case(out: Path, rank: int, hidden: int, fault: bool = False) -> dict:
    """Tensor parallelism on a transformers Llama: attention q/k/v and MLP gate/up by columns, o and
    down by rows; every rank reads the whole batch. With ``fault``, rank 1's ``layers.1``
    input norm 1 % off."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    model = tiny_llama(hidden)
    plan = {}
    for i in range(2):
        plan.update({f"layers.{i}.self_attn.{n}": ColwiseParallel() for n in ("q_proj", "k_proj", "v_proj")})
        plan.update({f"layers.{i}.mlp.{n}": ColwiseParallel() for n in ("gate_proj", "up_proj")})
        plan.update({f"layers.{i}.self_attn.o_proj": RowwiseParallel(), f"layers.{i}.mlp.down_proj": RowwiseParallel()})
    parallelize_module(model, init_device_mesh("cpu", (dist.get_world_size(),)), plan)
    faulty = AlterNorm() if fault and rank == 1 else None
    if faulty is not None:
        faulty.__enter__()
    try:
        with xray.dump(dump_dir=out / ("llama_tp_norm_bug" if fault else "llama_tp"), X_DEBUG=0x10A, X_DEDUP=False):
            model(input_ids=llama_tokens()).last_hidden_state.pow(2).mean().backward()
    finally:
        if faulty is not None:
            faulty.__exit__(None, None, None)
    return {"bitwise": True}


class AlterWeightGradient(torch.utils._python_dispatch.TorchDispatchMode):
    """A faulty kernel on one rank: the first backward ``mm`` whose output has ``shape`` (a
    weight's gradient, summed over this rank's batch) comes back 1 % off."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.shape, self.done = shape, False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if (not self.done and func is torch.ops.aten.mm.default and not types and tuple(out.shape) == self.shape
                and torch._C._current_graph_task_id() != -1):
            self.done = True
            out = out * 1.01
        return out


def llama_ddp_grad_bug_case(out: Path, rank: int, hidden: int) -> dict:
    """DDP on a transformers Llama, each rank half the batch; rank 1's first ``down_proj`` weight
    gradient ``mm`` 1 % off (below the recorder)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    world = dist.get_world_size()
    model = DDP(tiny_llama(hidden))
    ids = llama_tokens().chunk(world)[rank]
    faulty = AlterWeightGradient((hidden, 2 * hidden)) if rank == 1 else None
    if faulty is not None:
        faulty.__enter__()
    try:
        with xray.dump(dump_dir=out / "llama_ddp_grad_bug", X_DEBUG=0x10A, X_DEDUP=False):
            model(input_ids=ids).last_hidden_state.pow(2).mean().backward()
    finally:
        if faulty is not None:
            faulty.__exit__(None, None, None)
    return {"bitwise": True}


CASES = {"llama_single": llama_single_case, "llama_tp": llama_tp_case, "llama_ddp_grad_bug": llama_ddp_grad_bug_case,
         "llama_tp_norm_bug": lambda o, r, h: llama_tp_case(o, r, h, fault=True),
         "fsdp": fsdp_case, "fsdp_bug": lambda o, r, h: fsdp_case(o, r, h, fault=True), "tp": tp_case, "tp_step": tp_step_case, "tp_bug": lambda o, r, h: tp_step_case(o, r, h, fault=True),
         "single": single_case,
         "single4": lambda o, r, h: single_case(o, r, h, batch=4, name="single4"),
         "ddp": ddp_case, "ddp_bug": lambda o, r, h: ddp_case(o, r, h, fault=True),
         "ddp_seed_bug": lambda o, r, h: ddp_case(o, r, h, seed_fault=True),
         "ddp_pos_bug": lambda o, r, h: ddp_case(o, r, h, position_fault=True),
         "pos_single4": lambda o, r, h: single_case(o, r, h, batch=4, name="pos_single4", model_cls=Positioned), "tp_fault": lambda o, r, h: tp_case(o, r, h, fault=True), "funcol": funcol_case,
         "funcol_fault": lambda o, r, h: funcol_case(o, r, h, fault=True)}


def rank_main(rank: int, world: int, out: Path, hidden: int, cases: list[str]) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out / 'store'}", rank=rank, world_size=world)
    try:
        for case in cases:
            result = CASES[case](out, rank, hidden)
            dist.barrier()
            if not (out / case / f"rank_{rank}").exists():  # a single-device case: rank 0 only
                continue
            dump = xray.load_dump(out / case / f"rank_{rank}")
            result.update(records=len(dump.records), stopped=dump.summary.get("stopped"), error=dump.summary.get("error"))
            (out / f"{case}.rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--cases", default="tp,funcol,funcol_fault")
    a = p.parse_args()
    a.out = a.out.resolve()
    a.out.mkdir(parents=True, exist_ok=True)
    cases = a.cases.split(",")
    mp.start_processes(rank_main, args=(a.world, a.out, a.hidden, cases), nprocs=a.world, start_method="fork")
    return 0


if __name__ == "__main__":
    sys.exit(main())
