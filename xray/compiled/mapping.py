"""Pair each buffer a compiled run wrote with the eager record output it holds.

A buffer holds exactly one post-grad FX node's value (inductor's ``origin_node``). That node
came from one Dynamo node (``from_node``) and was traced from one ATen op (``original_aten``);
the eager run of the Dynamo graph made a known group of records for that Dynamo node
(reference.py). Within the group:

- a node that is its ATen op, not decomposed (``addmm``, a fallback's ``getitem``), pairs with
  the eager call of that op in the same position among the group's calls of it;
- a node of a decomposition (``native_layer_norm`` into ``var_mean``, ``sub``, ``rsqrt``...)
  pairs only when it is a result of the decomposition (read by nothing inside it), the group
  made one call of that op, and exactly one of the call's outputs has the node's shape and dtype.

Anything else stays unpaired (an intermediate of a decomposition has no eager value); a wrong
pair would be a false divergence, a missing one only a coarser report.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .capture import CompiledGraph, NodeInfo


def base_op(op: str) -> str:
    """``aten.add_.Tensor`` -> ``aten.add.Tensor``: an in-place call and its functional form."""
    parts = op.split(".")
    if len(parts) == 3 and parts[1].endswith("_") and not parts[1].endswith("__"):
        parts[1] = parts[1][:-1]
    return ".".join(parts)


@dataclass
class Pair:
    """One compiled buffer paired with one eager record output."""

    seq: int
    out: int  # output index of the eager record
    graph: int
    run: int
    launch: int
    slot: int  # which written buffer of the launch
    buffer: str
    node: str  # the post-grad node the buffer holds
    kernel: str
    fused_nodes: list[str]
    fused_ops: list[str]
    stack_trace: str = ""


@dataclass
class Pairing:
    pairs: list[Pair] = field(default_factory=list)
    unpaired: dict[str, int] = field(default_factory=dict)  # why -> how many buffers
    kernels: int = 0  # probed launches (all runs)

    def skip(self, why: str) -> None:
        self.unpaired[why] = self.unpaired.get(why, 0) + 1


def _fits(shape: Any, meta: Any) -> bool:
    return meta is not None and tuple(meta.shape) == tuple(shape or ())


def _dtype(meta: Any) -> str:
    return str(getattr(meta, "dtype", "")).replace("torch.", "")


def pair_node(node: NodeInfo, nodes: dict[str, NodeInfo], group: list[Any]) -> tuple[Any, int] | str:
    """(eager record, output index) the node's value is, or why none."""
    base, out = node, None
    if node.target == "getitem" and node.args and node.args[0] in nodes:
        base, out = nodes[node.args[0]], node.index
    if not base.root:
        return "no Dynamo node (made by a compiler pass)"
    op = base_op(base.original_aten or base.target)
    calls = [r for r in group if base_op(r.op) == op]
    if not calls:
        return "no eager call of its ATen op in its Dynamo node"
    if base_op(base.target) == op:
        same = [n for n in nodes.values() if n.root == base.root and base_op(n.target) == op
                and base_op(n.original_aten or n.target) == op]
        if len(same) != len(calls) or base not in same:
            return "calls of its op differ in number between eager and the compiled graph"
        rec = calls[same.index(base)]
        metas = [m for _, m in rec.output_tensors()]
        if out is None:
            fits = [k for k, m in enumerate(metas) if _fits(node.shape, m)]
            out = fits[0] if len(fits) >= 1 and (len(metas) == 1 or len(fits) == 1) else None
        if out is None or out >= len(metas) or not _fits(node.shape, metas[out]):
            return "no output of the eager call has its shape"
        return rec, out
    inside = {n.name for n in nodes.values() if n.root == base.root and base_op(n.original_aten) == op}
    if len(calls) != 1:
        return "a decomposition piece in a Dynamo node with several calls of its op"
    if any(u in inside for u in node.users):
        return "an intermediate of a decomposition"
    rec = calls[0]
    metas = [m for _, m in rec.output_tensors()]
    fits = [k for k, m in enumerate(metas) if _fits(node.shape, m) and _dtype(m) == (node.dtype or "").replace("torch.", "")]
    if len(fits) != 1:
        return "no single output of the eager call has its shape and dtype"
    return rec, fits[0]


def last_writers(graph: CompiledGraph) -> dict[str, int]:
    """Buffer -> the last launch that writes it. A buffer one kernel fills and a later one
    updates in place (an embedding's gradient: zeros, then an accumulating scatter) holds its
    node's value only after the last write; a reused buffer has a new name, so a name written
    twice is one buffer."""
    last: dict[str, int] = {}
    for launch in graph.launches:
        for buf in launch.outputs:
            last[buf] = launch.index
    return last


def pair_runs(graphs: list[CompiledGraph], runs: list[int], node_seqs: list[dict[str, list[tuple[int, int]]]],
              by_seq: dict[int, Any], values: dict[tuple[int, int, int], tuple]) -> Pairing:
    """Pair every probed buffer of every compiled run with an eager record output.

    ``runs[i]`` is the Dynamo graph of eager run ``i`` (``node_seqs[i]`` its records per node);
    the k-th run of a Dynamo graph pairs with the k-th run of the inductor graph compiling it."""
    result = Pairing()
    seen: dict[int, int] = {}
    for i, dyn in enumerate(runs):
        k = seen.get(dyn, 0)
        seen[dyn] = k + 1
        groups = {name: [by_seq[s] for a, b in sorted(set(ranges)) for s in range(a, b) if s in by_seq]
                  for name, ranges in node_seqs[i].items()}
        for g in graphs:
            if g.dynamo != dyn:
                continue
            last = last_writers(g)
            for launch in g.launches:
                got = values.get((g.index, k, launch.index))
                if got is None:
                    continue
                result.kernels += 1
                fused = g.fused.get(launch.index) or sorted({o for b in launch.outputs for o in g.buffer_origins.get(b, [])})
                ops = sorted({base_op(g.nodes[n].original_aten or g.nodes[n].target) for n in fused if n in g.nodes})
                for slot, buf in enumerate(launch.outputs):
                    if last.get(buf, launch.index) != launch.index:
                        result.skip("written again by a later launch (its value is the last write's)")
                        continue
                    name = g.buffer_node.get(buf)
                    if name is None or name not in g.nodes:
                        result.skip("buffer holds no single FX node (no origin_node)")
                        continue
                    node = g.nodes[name]
                    found = pair_node(node, g.nodes, groups.get(node.root, []) if node.root else [])
                    if isinstance(found, str):
                        result.skip(found)
                        continue
                    rec, out = found
                    t = got[slot] if slot < len(got) else None
                    if t is None or tuple(t.shape) != tuple(node.shape or ()):
                        result.skip("the buffer's shape is not its node's")
                        continue
                    result.pairs.append(Pair(rec.seq, out, g.index, k, launch.index, slot, buf, name, launch.kernel,
                                             fused, ops, node.stack_trace))
    return result
