"""Memory written before it is read: tensors viewing uninitialised memory are recorded as such and
never compared, and a base written through its views names its writers (xray/record/unwritten.py).

The allocator's garbage is made explicit: a dispatch mode below the recorder fills every
allocation with this run's own noise, unseen by the recorder (a caching allocator hands back
whatever the last user left; two runs differ there)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import xray
from xray.compare import compare_dumps
from xray.dump.model import UNWRITTEN, Source, unwritten
from xray.numerics.rules import Rules
from xray.record.unwritten import ALLOCATING

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

FAILING = ("fail", "nan/inf")


class AllocatorGarbage(TorchDispatchMode):
    """Fills each allocation's float result with noise of this run's seed (below the recorder)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.gen = torch.Generator().manual_seed(seed)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ in ALLOCATING and isinstance(out, torch.Tensor) and out.is_floating_point():
            with torch.no_grad():
                out.normal_(0.0, 1e3, generator=self.gen)
        return out


def record(fn, folder: Path, seed: int | None = None, modes=(), **kw) -> Path:
    with AllocatorGarbage(seed) if seed is not None else _nothing():
        for m in modes:
            m.__enter__()
        try:
            with xray.dump(dump_dir=folder, **kw) as session:
                fn()
        finally:
            for m in reversed(modes):
                m.__exit__(None, None, None)
    return session.folder


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def failing(result) -> list:
    return [r for r in result.rows if r.status in FAILING]


# -- DeepSeek-V3 (transformers): the key built with new_empty and two slice copies ----------------
@pytest.fixture(scope="module")
def deepseek():
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "DeepseekV3Config"):
        pytest.skip("this transformers has no DeepSeek-V3")
    torch.manual_seed(0)
    config = transformers.DeepseekV3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2,
        n_group=1, topk_group=1, first_k_dense_replace=1, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=8, max_position_embeddings=64)
    model = transformers.DeepseekV3Model(config).eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    ids = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(0))

    def forward():
        with torch.no_grad():
            model(input_ids=ids)
    return forward


@pytest.mark.parametrize("kw", [{}, {"X_DEDUP": False, "X_DUMP_NUM": 0}], ids=["defaults", "every call"])
def test_identical_deepseek_v3_runs_never_differ(deepseek, kw, tmp_path):
    a = record(deepseek, tmp_path / "a", seed=1, **kw)
    b = record(deepseek, tmp_path / "b", seed=2, **kw)
    result = compare_dumps(a, b)
    assert not failing(result), [(r.bench_op, r.module, r.note) for r in failing(result)][:5]
    skipped = [r for r in result.rows if r.status == "skip" and r.note.startswith(UNWRITTEN)]
    assert {r.bench_op for r in skipped} == {"aten.slice.Tensor"}


def test_deepseek_v3_key_names_its_last_writer(deepseek, tmp_path):
    dump = xray.load_dump(record(deepseek, tmp_path, X_DEDUP=False, X_DUMP_NUM=0))
    ops = {r.seq: r for r in dump.records if r.kind == "op"}
    attention = "layers.0.self_attn"
    copies = [r for r in ops.values() if r.op == "aten.copy_.default" and r.module == attention]
    assert len(copies) == 2 and all(unwritten(c.inputs["self"]) for c in copies)
    assert not any(unwritten(c.outputs[0]) for c in copies)
    readers = [r for r in ops.values() if r.module == attention and r.seq > copies[1].seq
               for _, m in r.input_tensors() if m.source == f"op:{copies[1].seq}:0"]
    assert readers, "the key's first reader names the second copy"


def test_tf32_deepseek_v3_keeps_no_failure_at_the_uninitialised_key(deepseek, tmp_path):
    from accuracy.faults import ReducedPrecisionMatmul

    a = record(deepseek, tmp_path / "a", seed=1, X_DUMP_NUM=0)  # statistics: what garbage moved
    b = record(deepseek, tmp_path / "b", seed=2, modes=[ReducedPrecisionMatmul()], X_DUMP_NUM=0)
    result = compare_dumps(a, b, rules=Rules(tf32=True))
    at_key = [r for r in failing(result) if r.bench_op in ("aten.new_empty.default", "aten.slice.Tensor")
              or "new_empty" in r.culprit or "slice" in r.culprit]
    assert not at_key, [(r.bench_op, r.module, r.cause, r.culprit) for r in at_key][:5]


# -- toys: a MoE un-permute, an out= buffer, slice copies, a writer the recorder does not see ------
def test_empty_like_then_index_put_is_not_compared_before_the_write(tmp_path):
    x = torch.randn(6, 4)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])

    def unpermute():
        out = torch.empty_like(x)
        out[perm] = x * 2
        return (out + 1).sum()

    a, b = (record(unpermute, tmp_path / s, seed=seed, X_DEDUP=False) for s, seed in (("a", 1), ("b", 2)))
    assert not failing(compare_dumps(a, b))
    dump = xray.load_dump(a)
    (put,) = [r for r in dump.records if r.op == "aten.index_put_.default"]
    assert unwritten(put.inputs["self"]) and not unwritten(put.outputs[0])
    (add,) = [r for r in dump.records if r.op == "aten.add.Tensor"]
    assert add.inputs["self"].source == f"op:{put.seq}:0" and add.inputs["self"].stats is not None


def test_out_buffer_is_unwritten_until_the_call_writes_it(tmp_path):
    m, n = torch.randn(3, 4), torch.randn(4, 5)

    def fn():
        buf = torch.empty(3, 5)
        torch.mm(m, n, out=buf)
        return buf.exp()

    dump = xray.load_dump(record(fn, tmp_path, X_DEDUP=False))
    (mm,) = [r for r in dump.records if r.op == "aten.mm.out"]
    assert unwritten(mm.inputs["out"]) and mm.inputs["out"].stats is None
    assert mm.outputs[0].stats is not None and mm.outputs[0].note is None


@pytest.mark.parametrize("path", ["native", "python", "record"])
@pytest.mark.usefixtures("one_record_per_key")
def test_slice_copies_on_every_record_path(path, tmp_path, monkeypatch):
    """The C path (which leaves tracked calls to Python), the Python row path and the Record
    path write the same notes and edges; the second slice, taken after the first copy, still
    views memory nobody wrote."""
    monkeypatch.setenv("XRAY_ROW_PATH", "0" if path == "record" else "1")
    monkeypatch.setenv("XRAY_NATIVE_ROWS", "1" if path == "native" else "0")
    a, b = torch.randn(2, 3, 4), torch.randn(2, 3, 2)

    def fn():
        for _ in range(2):  # the second round is folded by de-dup
            k = a.new_empty(2, 3, 6)
            k[..., :4].copy_(a)
            k[..., 4:].copy_(b)
            k.mul(2)

    dump = xray.load_dump(record(fn, tmp_path))
    recs = dump.records
    slices = [r for r in recs if r.op == "aten.slice.Tensor"]
    copies = [r for r in recs if r.op == "aten.copy_.default"]
    assert len(slices) == len(copies) == 2
    assert all(unwritten(s.outputs[0]) and unwritten(s.inputs["self"]) for s in slices)
    assert all(unwritten(c.inputs["self"]) and not unwritten(c.outputs[0]) for c in copies)
    (mul,) = [r for r in recs if r.op == "aten.mul.Tensor"]
    assert mul.inputs["self"].source == f"op:{copies[1].seq}:0" and mul.inputs["self"].stats is not None
    (new,) = [r for r in recs if r.op == "aten.new_empty.default"]
    assert new.count == 2 and mul.count == 2  # the second round ran folded


def test_a_writer_the_recorder_does_not_see(tmp_path):
    """A buffer filled without an ATen call (a Triton kernel; here numpy) is data once a call
    computes from it: the read shows it was written."""
    def fn():
        buf = torch.empty(4)
        buf.numpy()[:] = [1.0, 2.0, 3.0, 4.0]
        return buf.sum()

    dump = xray.load_dump(record(fn, tmp_path, X_DEDUP=False))
    (total,) = [r for r in dump.records if r.op == "aten.sum.default"]
    assert not unwritten(total.inputs["self"]) and total.inputs["self"].stats.mean == 2.5
    assert Source.parse(total.inputs["self"].source).seq == dump.records[0].seq
