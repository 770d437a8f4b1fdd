"""Launched by torchrun in tests: every rank dumps the same small Llama forward (gloo, CPU)."""
import sys

import torch
import torch.distributed as dist

import xray
from xray.demo.models import tiny_llama, token_batch

dist.init_process_group("gloo")
rank = dist.get_rank()
model = tiny_llama(layers=1, hidden=32)
ids = token_batch(batch=1, seq=8, seed=rank)  # each rank sees its own shard of the batch
with torch.no_grad(), xray.dump(dump_dir=sys.argv[1], X_DEDUP=False, X_DUMP_NUM=4):
    logits = model(ids).logits
    total = logits.sum()
    dist.all_reduce(total)  # a collective inside the dump is recorded like any op
dist.barrier()
dist.destroy_process_group()
