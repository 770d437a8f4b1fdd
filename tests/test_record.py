"""The recorder (issue 2): every ATen call and module boundary, exact, transparent, crash-safe."""
from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import xray
from xray.dump import DumpFormatError, RefusedRecordsWarning, TruncatedDumpWarning
from xray.dump.model import Scalar, TensorMeta


class OpCounter(TorchDispatchMode):
    """An independent count of ATen calls, to check the tracer misses none."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def record(fn, **kw):
    kw.setdefault("X_DEDUP", False)
    with xray.dump(**kw) as session:
        out = fn()
    return out, xray.load_dump(session.folder)


def ops_of(dump, kind="op"):
    return [r for r in dump.records if r.kind == kind]


# -- end to end on a real model -----------------------------------------------------------------

def test_real_llama_records_every_op_resolvably_and_bitwise_transparently(llama, tokens, tmp_path):
    with torch.no_grad():
        expected = llama(tokens).logits
        counter = OpCounter()
        with counter:
            llama(tokens)
        out, dump = record(lambda: llama(tokens).logits, dump_dir=tmp_path)
    assert torch.equal(out, expected)
    recorded = [r.op for r in ops_of(dump)]
    assert recorded == counter.ops  # same ops, same order, none missed
    for r in ops_of(dump):
        ns, name, overload = r.op.split(".")
        assert isinstance(getattr(getattr(getattr(torch.ops, ns), name), overload), torch._ops.OpOverload)
    assert dump.complete and dump.summary["op_calls"] == len(counter.ops)
    q_proj = [r for r in ops_of(dump) if r.module == "model.layers.0.self_attn.q_proj"]
    assert q_proj and q_proj[0].module_stack[-1] == ("model.layers.0.self_attn.q_proj", "Linear")
    assert ("model.layers.0", "LlamaDecoderLayer") in q_proj[0].module_stack


def test_a_users_function_mode_sees_the_models_torch_calls_only(llama, tokens, tmp_path):
    """A TorchFunctionMode around a recorded forward (a user's counter; ``with torch.device(...)``,
    which places new tensors) sees the calls it sees without the recorder, in trace and module
    dumps: the recorder's statistics, self-checks and file writes are not the model's. (It saw 21x
    as many, its own ``detach``, ``numpy`` and ``contiguous`` among them.)"""
    from torch.overrides import TorchFunctionMode

    class Calls(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.names.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    with torch.no_grad():
        with Calls() as plain:
            llama(tokens)
        with Calls() as traced, xray.dump(dump_dir=tmp_path / "trace", X_DEDUP=False):
            llama(tokens)
        with Calls() as debugged:
            debugger = xray.PrecisionDebugger(dump_path=tmp_path / "module", model=llama, task="statistics")
            debugger.start()
            llama(tokens)
            debugger.stop()
            debugger.close()
    assert plain.names and traced.names == plain.names
    assert debugged.names == plain.names


@pytest.mark.usefixtures("one_record_per_key")
def test_dedup_collapses_repeated_signatures_and_keeps_counts(llama, tokens, tmp_path):
    """De-dup keeps a record per signature per module: the second forward folds whole, and
    layer 1 keeps records of its own (a fault there is named, not folded into layer 0's)."""
    def twice():
        llama(tokens)
        llama(tokens)
    with torch.no_grad():
        _, full = record(twice, dump_dir=tmp_path / "full", X_DEDUP=False)
        _, dedup = record(twice, dump_dir=tmp_path / "dedup", X_DEDUP=True)
    full_ops, dedup_ops = ops_of(full), ops_of(dedup)
    assert sum(r.count for r in dedup_ops) == len(full_ops)
    assert len(dedup_ops) <= len(full_ops) / 2  # the second forward adds no record
    assert any(r.module.startswith("model.layers.1") for r in dedup_ops)
    by_seq = {f.seq: f for f in full_ops}
    for r in dedup_ops:
        assert r.first_seq == r.seq <= r.last_seq
        first, last = by_seq[r.first_seq], by_seq[r.last_seq]
        assert first.op == last.op == r.op and first.module == last.module == r.module  # folded in its module


def test_dedup_copies_a_signatures_tensors_once(llama, tokens, tmp_path):
    """X_DUMP_NUM's tensors are copied for a signature's first record only: layer 1's records of
    layer 0's signatures keep statistics (tensors would cost what every layer's do)."""
    with torch.no_grad():
        _, dump = record(lambda: llama(tokens), dump_dir=tmp_path, X_DEDUP=True, X_DUMP_NUM=5)
    ops = ops_of(dump)

    def saved(r):
        return any(m.data is not None for _, m in (*r.input_tensors(), *r.output_tensors()))

    def arg(v):
        if isinstance(v, TensorMeta):
            return tuple(v.shape), v.dtype, tuple(v.stride or ())
        return tuple(arg(x) for x in v) if isinstance(v, list) else repr(v)

    def key(r):  # the module-free signature: the op, its tensors' shapes, dtypes, strides, the other values
        return r.op, tuple((n, arg(v)) for n, v in r.inputs.items())

    layer1 = [r for r in ops if r.module.startswith("model.layers.1")]
    assert layer1 and all(not saved(r) and all(m.stats is not None for _, m in r.output_tensors()) for r in layer1)
    with_data = [key(r) for r in ops if saved(r)]
    assert len(with_data) == len(set(with_data)) > 0
    assert {key(r) for r in ops} == set(with_data)  # every signature has its tensors once


@pytest.mark.usefixtures("one_record_per_key")
def test_calls_with_a_generator_argument_dedup_into_one_record(tmp_path):
    """A Generator's repr holds its address; keyed by it, every randn(generator=g) was a new
    signature (one record and one plan per call)."""
    g = torch.Generator().manual_seed(0)

    def run():
        for _ in range(5):
            torch.nn.functional.dropout(torch.randn(4, 4, generator=g), 0.5, training=True)
    _, dump = record(run, dump_dir=tmp_path, X_DEDUP=True)
    (randn,) = [r for r in ops_of(dump) if r.op == "aten.randn.generator"]
    assert randn.count == 5 and "0x" not in str(randn.inputs)


def test_a_wrapper_subclass_keeps_its_statistics_and_a_note_when_tensors_are_saved(tmp_path):
    """X_DUMP_NUM on a TwoTensor: its .numpy() raised at the flush and the dump was lost to the
    journal. Now the subclass's rows say why they hold no data; plain tensors beside it are saved."""
    two_tensor = pytest.importorskip("torch.testing._internal.two_tensor")
    x = two_tensor.TwoTensor(torch.randn(3, 3), torch.randn(3, 3))
    plain = torch.randn(3, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # neither a stopped recording nor a truncated dump
        _, dump = record(lambda: ((x * 2).sum(), plain * 2), dump_dir=tmp_path, X_DUMP_NUM=2)
    by_op = {r.op: r for r in ops_of(dump)}
    (out,) = by_op["aten.sum.default"].outputs
    assert out.data is None and "TwoTensor" in out.note and out.stats is not None
    sub_mul, plain_mul = [r.outputs[0] for r in ops_of(dump) if r.op == "aten.mul.Tensor"]
    assert sub_mul.data is None and "TwoTensor" in sub_mul.note
    assert plain_mul.data is not None and plain_mul.note is None


def test_statistics_and_saved_tensors_replay_exactly(tmp_path):
    a, b = torch.randn(4, 5), torch.randn(5, 3)
    out, dump = record(lambda: torch.mm(a, b), dump_dir=tmp_path, X_DUMP_NUM=3)
    (rec,) = ops_of(dump)
    assert rec.op == "aten.mm.default"
    s = rec.inputs["self"].stats
    assert s.min == a.min().item() and s.max == a.max().item()
    assert math.isclose(s.mean, a.mean().item(), rel_tol=1e-6)
    assert math.isclose(s.std, a.std(correction=0).item(), rel_tol=1e-5)
    saved_a, saved_b = dump.load_tensor(rec.inputs["self"]), dump.load_tensor(rec.inputs["mat2"])
    assert torch.equal(saved_a, a) and torch.equal(saved_b, b)
    assert torch.equal(dump.load_tensor(rec.outputs[0]), out)
    assert torch.equal(torch.ops.aten.mm.default(saved_a, saved_b), out)


def test_dump_num_limits_saved_tensors_per_side(tmp_path):
    """X_DUMP_NUM=n: the first n inputs and the first n outputs, so many inputs never cost the outputs."""
    x = torch.randn(3)
    _, dump = record(lambda: torch.addcmul(x, x, x), dump_dir=tmp_path, X_DUMP_NUM=2)
    (rec,) = ops_of(dump)
    saved = [n for n, m in list(rec.input_tensors()) + list(rec.output_tensors()) if m.data]
    assert saved == ["self", "tensor1", "out0"]
    _, dump0 = record(lambda: torch.addcmul(x, x, x), dump_dir=tmp_path / "none", X_DUMP_NUM=0)
    assert not any(m.data for _, m in ops_of(dump0)[0].input_tensors())


def test_in_place_records_input_before_mutation_and_mutated_args(tmp_path):
    x = torch.zeros(8)
    _, dump = record(lambda: x.add_(5.0), dump_dir=tmp_path, X_DUMP_NUM=2)
    (rec,) = ops_of(dump)
    assert rec.op == "aten.add_.Tensor" and rec.mutates == ["self"]
    assert rec.inputs["self"].stats.max == 0.0  # before
    assert rec.outputs[0].stats.max == 5.0  # after
    assert torch.equal(dump.load_tensor(rec.inputs["self"]), torch.zeros(8))


def test_out_variant_marks_out_as_mutated(tmp_path):
    a, b, c = torch.ones(3), torch.ones(3), torch.empty(3)
    _, dump = record(lambda: torch.add(a, b, out=c), dump_dir=tmp_path)
    (rec,) = ops_of(dump)
    assert rec.op == "aten.add.out" and "out" in rec.mutates and "out" in rec.inputs


def test_tuple_and_list_outputs_and_tensor_list_inputs(tmp_path):
    x = torch.randn(4, 6)

    def fn():
        v, i = torch.max(x, dim=1)
        parts = torch.split(x, 2, dim=1)
        return torch.cat(parts, dim=0), v, i

    _, dump = record(fn, dump_dir=tmp_path, X_DUMP_NUM=10)
    by_op = {r.op: r for r in ops_of(dump)}
    mx = by_op["aten.max.dim"]
    assert [m.dtype for _, m in mx.output_tensors()] == ["float32", "int64"]
    split = by_op["aten.split.Tensor"]
    assert len(split.outputs[0]) == 3
    cat = by_op["aten.cat.default"]
    names = [n for n, _ in cat.input_tensors()]
    assert names == ["tensors.0", "tensors.1", "tensors.2"]
    assert cat.inputs["dim"] == 0
    assert torch.equal(dump.load_tensor(cat.inputs["tensors"][1]), x[:, 2:4])


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.complex64, torch.float16,
                                   torch.bfloat16, torch.float64, torch.uint8])
def test_every_dtype_round_trips_bit_for_bit(dtype, tmp_path):
    base = torch.randn(5, 4) * 10
    x = base.to(dtype) if dtype != torch.complex64 else torch.complex(base, -base)
    out, dump = record(lambda: x.clone(), dump_dir=tmp_path, X_DUMP_NUM=2)
    (rec,) = ops_of(dump)
    saved = dump.load_tensor(rec.outputs[0])
    assert saved.dtype == dtype and torch.equal(saved, out)
    assert rec.inputs["self"].dtype == str(dtype).removeprefix("torch.")
    assert rec.inputs["self"].stats.numel == 20


def test_zero_size_and_non_finite_tensors(tmp_path):
    empty = torch.empty(0, 3)
    bad = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 3.0])
    _, dump = record(lambda: (empty * 2, bad * 1), dump_dir=tmp_path, X_DUMP_NUM=2)
    e, b = ops_of(dump)
    assert e.outputs[0].shape == (0, 3) and e.outputs[0].stats.min is None
    s = b.outputs[0].stats
    assert (s.nan, s.posinf, s.neginf) == (1, 1, 1)
    assert (s.min, s.max, s.mean) == (1.0, 3.0, 2.0)  # over the finite elements
    saved = dump.load_tensor(b.outputs[0])
    assert torch.equal(saved.isnan(), bad.isnan()) and saved[2] == float("inf")


def test_non_tensor_arguments_are_tagged_values(tmp_path):
    x = torch.randn(2, 3)
    _, dump = record(lambda: (x.to(torch.float16), torch.full((2,), float("inf")),
                              torch.zeros(2, device="cpu", dtype=torch.int32)), dump_dir=tmp_path)
    by_op = {r.op: r for r in ops_of(dump)}
    assert by_op["aten._to_copy.default"].inputs["dtype"] == Scalar("dtype", "float16")
    assert by_op["aten.full.default"].inputs["fill_value"] == Scalar("float", float("inf"))
    zeros = by_op["aten.zeros.default"]
    assert zeros.inputs["size"] == [2] and zeros.inputs["device"] == Scalar("device", "cpu")


def test_views_strides_and_offsets(tmp_path):
    x = torch.randn(4, 6)
    _, dump = record(lambda: x.t()[1:].contiguous(), dump_dir=tmp_path)
    t, sl, cont = ops_of(dump)
    assert t.outputs[0].stride == (1, 6)
    assert sl.outputs[0].storage_offset == 1 and sl.outputs[0].shape == (5, 4)
    assert cont.outputs[0].stride == (4, 1)


# -- modes, autocast, grad ----------------------------------------------------------------------

def test_no_grad_inference_mode_and_autocast(llama, tokens, tmp_path):
    with torch.inference_mode():
        expected = llama(tokens).logits
        out, dump = record(lambda: llama(tokens).logits, dump_dir=tmp_path / "inf")
    assert torch.equal(out, expected)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = llama(tokens).logits
        out, dump = record(lambda: llama(tokens).logits, dump_dir=tmp_path / "ac")
    assert torch.equal(out, expected)
    assert any(m.dtype == "bfloat16" for r in ops_of(dump) for _, m in r.output_tensors())


def test_backward_ops_and_gradients_are_bitwise_identical(tmp_path):
    from xray.demo.models import tiny_llama, token_batch

    ids = token_batch(seq=8)

    def step(model):
        model.zero_grad()
        loss = model(ids, labels=ids).loss
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    model = tiny_llama(layers=1, hidden=32).train()
    loss0, grads0 = step(model)
    (loss1, grads1), dump = record(lambda: step(model), dump_dir=tmp_path, X_DEBUG=0x10A)
    assert torch.equal(loss0, loss1)
    assert all(torch.equal(a, b) for a, b in zip(grads0, grads1))
    backward = [r for r in ops_of(dump) if r.direction == "backward"]
    assert backward, "X_DEBUG bit 0x008 records backward ops"
    assert any(r.module and "self_attn" in r.module for r in backward), "backward ops are attributed to modules"
    _, no_bw = record(lambda: step(model), dump_dir=tmp_path / "nobw", X_DEBUG=0x102)
    assert all(r.direction == "forward" for r in no_bw.records)


def test_module_boundary_records(llama, tokens, tmp_path):
    with torch.no_grad():
        _, dump = record(lambda: llama(tokens), dump_dir=tmp_path, X_DEBUG=0x112)
    mods = ops_of(dump, "module")
    paths = [r.module for r in mods]
    assert "model.layers.1.mlp" in paths and "" in paths  # "" = the outermost module
    root = [r for r in mods if r.module == ""][0]
    assert root.op == "LlamaForCausalLM" and root.seq == max(r.seq for r in dump.records)
    q = [r for r in mods if r.module == "model.layers.0.self_attn.q_proj"][0]
    assert q.inputs["input.0"].shape == (2, 16, 64) and q.outputs[0].stats is not None


def test_stack_traces_point_at_user_code(tmp_path):
    _, dump = record(lambda: torch.ones(2) + 1, dump_dir=tmp_path, X_DEBUG=0x106)
    assert any("test_record.py" in line for line in ops_of(dump)[-1].stack)


def test_other_dispatch_modes_still_see_every_op_and_results_match(tmp_path):
    x = torch.randn(8, 8)
    expected = (x @ x).relu().sum()
    inner = OpCounter()
    with xray.dump(dump_dir=tmp_path, X_DEDUP=False) as session:
        with inner:  # a user mode pushed inside ours
            got = (x @ x).relu().sum()
    outer = OpCounter()
    with outer:  # and a user mode outside ours
        got2, dump2 = record(lambda: (x @ x).relu().sum(), dump_dir=tmp_path / "2")
    assert torch.equal(got, expected) and torch.equal(got2, expected)
    assert inner.ops == ["aten.mm.default", "aten.relu.default", "aten.sum.default"], inner.ops
    assert [r.op for r in ops_of(xray.load_dump(session.folder))] == inner.ops
    assert outer.ops == inner.ops == [r.op for r in ops_of(dump2)]


# -- configuration, layout, life cycle ----------------------------------------------------------

def test_environment_variables_configure_the_dump(tmp_path, monkeypatch):
    monkeypatch.setenv("X_DEBUG", "0x106")
    monkeypatch.setenv("X_DEDUP", "0")
    monkeypatch.setenv("X_DUMP_NUM", "0")
    monkeypatch.setenv("X_DUMP_DIR", str(tmp_path / "env"))
    folder = xray.begin_dump()
    torch.ones(2) + torch.ones(2)
    torch.ones(2) + torch.ones(2)
    assert xray.end_dump() == folder
    assert folder.parent == tmp_path / "env" and folder.name == f"proc_{os.getpid()}"
    dump = xray.load_dump(folder / "dump.json")
    assert dump.header["config"] == {"X_DEBUG": 0x106, "X_DEDUP": False, "X_DUMP_NUM": 0,
                                     "flags": ["STATS", "STACK", "META"]}
    assert len([r for r in dump.records if r.op == "aten.add.Tensor"]) == 2


def test_rank_names_the_folder_under_torchrun(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    with xray.dump(dump_dir=tmp_path) as session:
        torch.ones(1) * 2
    assert session.folder == tmp_path / "rank_3"


def test_misuse_gives_clear_errors_and_never_breaks_forward(tmp_path):
    with pytest.raises(xray.DumpUsageError, match="without an active begin_dump"):
        xray.end_dump()
    xray.begin_dump(dump_dir=tmp_path)
    try:
        with pytest.raises(xray.DumpUsageError, match="call end_dump"):
            xray.begin_dump(dump_dir=tmp_path / "other")
    finally:
        xray.end_dump()
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.warns(RuntimeWarning, match="not dumping"):
        assert xray.begin_dump(dump_dir=blocker / "sub") is None
    assert torch.equal(torch.ones(2) * 3, torch.full((2,), 3.0))


@pytest.mark.usefixtures("one_record_per_key")
def test_clear_context_false_resumes_the_same_dump(tmp_path):
    folder = xray.begin_dump(dump_dir=tmp_path, X_DEDUP=True)
    torch.ones(3) * 2
    xray.end_dump(clear_context=False)
    assert [r.op for r in xray.load_dump(folder).records] == ["aten.ones.default", "aten.mul.Tensor"]
    assert xray.begin_dump() == folder
    torch.ones(3) * 2
    torch.ones(3) - 1
    xray.end_dump()
    counts = {r.op: r.count for r in xray.load_dump(folder).records}
    assert counts == {"aten.ones.default": 3, "aten.mul.Tensor": 2, "aten.sub.Tensor": 1}


# -- crash safety and bad files -----------------------------------------------------------------

CRASH_SCRIPT = textwrap.dedent("""
    import os, signal, sys, torch, xray
    xray.begin_dump(dump_dir=sys.argv[1], X_DEDUP=False, X_DUMP_NUM=2, flush_records=16, flush_seconds=0.05)
    x = torch.randn(64, 64)
    for i in range(400):
        x = torch.tanh(x @ x) + 0.5
        if i == 300:
            os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.slow  # a subprocess model run; SIGKILL mid-write stays fast in tests/test_session_safety.py
def test_sigkill_mid_forward_leaves_a_readable_truncated_dump(tmp_path):
    proc = subprocess.run([sys.executable, "-c", CRASH_SCRIPT, str(tmp_path)], capture_output=True)
    assert proc.returncode == -9
    (folder,) = [p for p in tmp_path.iterdir()]
    assert not (folder / "dump.json").exists()
    with pytest.warns(TruncatedDumpWarning, match="not finalised"):
        dump = xray.load_dump(folder)
    assert not dump.complete
    # flushed every 16 records: at most the last unflushed batch is lost of ~1200 calls before the kill
    assert len(dump.records) >= 3 * 300 - 16 - 4
    saved = [m for r in dump.records for _, m in r.input_tensors() if m.data and dump.has_data(m)]
    assert saved and dump.load_tensor(saved[-1]).shape == (64, 64)


DISK_FULL_SCRIPT = textwrap.dedent("""
    import resource, signal, sys, warnings, torch, xray
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)        # get EFBIG instead of being killed
    resource.setrlimit(resource.RLIMIT_FSIZE, (300_000, 300_000))  # a 'disk' that fills up
    torch.manual_seed(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        xray.begin_dump(dump_dir=sys.argv[1], X_DEDUP=False, X_DUMP_NUM=5, flush_records=8)
        y = torch.randn(64, 64)
        for _ in range(50):
            y = torch.tanh(y @ y)
        xray.end_dump()
    print("WARN", any("recording stopped" in str(w.message) for w in caught))
    torch.manual_seed(0)
    z = torch.randn(64, 64)
    for _ in range(50):
        z = torch.tanh(z @ z)
    print("SAME", torch.equal(y, z))
""")


@pytest.mark.slow
def test_full_disk_stops_recording_but_not_the_program(tmp_path):
    """The first tensor segment (8 records' copies, ~320 KB) is over the 300 KB limit. Its
    records still reach the journal, without data references to the segment that was never
    written (they used to be dropped with it: 0 records readable), and no partial file stays."""
    proc = subprocess.run([sys.executable, "-c", DISK_FULL_SCRIPT, str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "WARN True" in proc.stdout and "SAME True" in proc.stdout
    (folder,) = list(tmp_path.iterdir())
    assert not list(folder.glob("*.tmp"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TruncatedDumpWarning)
        dump = xray.load_dump(folder)
    assert [r.op for r in dump.records[:3]] == ["aten.randn.default", "aten.mm.default", "aten.tanh.default"]
    for r in dump.records:
        for _, meta in (*r.input_tensors(), *r.output_tensors()):
            assert meta.data is None or dump.has_data(meta)


def test_corrupt_and_future_dumps_are_refused_clearly(tmp_path):
    with xray.dump(dump_dir=tmp_path) as session:
        torch.ones(2) + 1
    index = session.folder / "dump.json"
    text = index.read_text()
    index.write_text(text.replace('"format_version":3', '"format_version":99'))
    with pytest.raises(DumpFormatError, match="version 99 is not supported"):
        xray.load_dump(session.folder)
    index.write_text(text[: len(text) // 2])  # a finished dump has no journal to fall back on
    assert not (session.folder / "journal.jsonl").exists()
    with pytest.raises(DumpFormatError, match="corrupt dump index"):
        xray.load_dump(session.folder)
    with pytest.raises(DumpFormatError, match="no such file"):
        xray.load_dump(tmp_path / "missing")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "dump.json").write_text('{"format": "xray-trace", "format_version": 1, "records": [{"kind": 1}]}')
    with pytest.warns(RefusedRecordsWarning, match="record #0 .*malformed"):  # refused alone (issue 30)
        assert [x.row for x in xray.load_dump(bad).refused] == [0]


def test_tensor_reference_cannot_escape_the_dump_folder(tmp_path):
    with xray.dump(dump_dir=tmp_path, X_DUMP_NUM=1) as session:
        torch.ones(2) + 1
    dump = xray.load_dump(session.folder)
    meta = TensorMeta(shape=(2,), dtype="float32", data="../../etc/passwd:x")
    with pytest.raises(DumpFormatError, match="outside the dump"):
        dump.load_tensor(meta)


def test_nonfinite_scalars_are_valid_json_and_tensor_lists_kept_without_meta(tmp_path):
    """dump.json is strict JSON (no -Infinity), and aten.cat's Tensor[] input is recorded with
    statistics only (X_DEBUG=0x002)."""
    import json

    with xray.dump(X_DEBUG=0x102, X_DEDUP=False, X_DUMP_NUM=0, dump_dir=tmp_path / "a") as a:
        torch.ones(2).clamp(min=float("-inf"))
    json.loads((a.folder / "dump.json").read_text(), parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    with xray.dump(X_DEBUG=0x002, X_DEDUP=False, X_DUMP_NUM=0, dump_dir=tmp_path / "b") as b:
        torch.cat([torch.ones(2, 3), torch.zeros(1, 3)])
    cat = next(r for r in xray.load_dump(b.folder).records if r.op == "aten.cat.default")
    assert [m.stats.max for _, m in cat.input_tensors()] == [1.0, 0.0]


class _Raises(torch.nn.Module):
    def forward(self, x):
        raise ValueError("inner failure")


class _CatchesInner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = _Raises()

    def forward(self, x):
        try:
            self.inner(x[:1])
        except ValueError:
            pass
        return x * 2


def test_module_that_raises_leaves_its_caller_inputs_intact(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the always_call hook must not raise on the error path
        with xray.dump(X_DEBUG=0x112, X_DEDUP=False, X_DUMP_NUM=0, dump_dir=tmp_path) as d:
            _CatchesInner()(torch.ones(4, 3))
    outer = [r for r in xray.load_dump(d.folder).records if r.kind == "module"]
    assert [(r.op, r.inputs["input.0"].shape) for r in outer] == [("_CatchesInner", (4, 3))]
