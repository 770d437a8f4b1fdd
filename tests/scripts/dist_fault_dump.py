"""Launched by torchrun in tests: 4 gloo ranks record a tiny sharded MLP twice, a bench and a
target. In the target, rank 2's second weight is wrong (used after collective 1) and rank 1's
third weight is wrong (used after collective 2); broadcasts from rank 0 keep each fault on its
rank until the closing all_reduce (collective 3) spreads both to every rank.

    torchrun --nproc-per-node 4 dist_fault_dump.py BENCH_DIR TARGET_DIR
"""
import sys

import torch
import torch.distributed as dist

import xray

FAULTS = {2: "w2", 1: "w3"}  # target rank -> its wrong weight

dist.init_process_group("gloo")
rank = dist.get_rank()
g = torch.Generator().manual_seed(0)  # the same weights on every rank
weights = {"w1": torch.randn(8, 16, generator=g), "w2": torch.randn(16, 16, generator=g),
           "w3": torch.randn(16, 8, generator=g)}
x = torch.randn(4, 8, generator=torch.Generator().manual_seed(100 + rank))  # this rank's shard


def forward(w: dict) -> torch.Tensor:
    h = torch.relu(x @ w["w1"])
    shared = h.mean(0, keepdim=True)
    dist.broadcast(shared, src=0)  # collective 1
    h = torch.tanh((h + shared) @ w["w2"])
    shared = h.mean(0, keepdim=True)
    dist.broadcast(shared, src=0)  # collective 2
    y = torch.sigmoid((h * shared) @ w["w3"])
    dist.all_reduce(y)  # collective 3
    return y.sum()


for folder, faulty in ((sys.argv[1], False), (sys.argv[2], True)):
    w = dict(weights)
    if faulty and rank in FAULTS:
        w[FAULTS[rank]] = w[FAULTS[rank]].clone()
        w[FAULTS[rank]][0, 0] += 0.5
    with torch.no_grad(), xray.dump(dump_dir=folder, X_DEDUP=False, X_DUMP_NUM=4):
        forward(w)
    dist.barrier()
dist.destroy_process_group()
