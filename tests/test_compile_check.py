"""xray compile-check: a torch.compile'd run recorded kernel by kernel and compared with eager
(real inductor C++ kernels on CPU; faults injected inside the compiler)."""
from __future__ import annotations

import json
import runpy
import subprocess
import sys

import pytest
import torch
from torch import nn

from xray.compiled import compile_check
from xray.compiled.faults import FAULT_NODE, ScaleNode, wrong_decompositions


class Block(nn.Module):
    """Linear, GELU, LayerNorm, Linear, softmax: an extern kernel, a fused pointwise+reduction
    kernel, another extern kernel and a fused softmax kernel."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.norm, self.down = nn.Linear(16, 16), nn.LayerNorm(16), nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(nn.functional.gelu(self.up(x)))
        return torch.softmax(self.down(h) * 2, -1).sum(-1)


def block() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    return Block().eval(), (torch.randn(2, 4, 16),)


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    model, args = block()
    return compile_check(model, args, out=tmp_path_factory.mktemp("cc") / "clean")


@pytest.mark.slow
def test_clean_compile_is_precision_and_recording_keeps_outputs(clean):
    s = clean.summary
    assert s["failed"] == 0 and s["nan_inf"] == 0 and s["first_divergence"] is None
    assert clean.verdict.startswith("precision")
    assert clean.outputs_equal and clean.eager_equal
    assert clean.kernels == 4 and clean.paired >= 4  # 2 extern addmm, 2 C++ kernels
    assert s["passed"] >= 4
    for name in ("summary.json", "compare.csv", "report.html"):
        assert (clean.out / name).is_file()
    assert json.loads((clean.out / "summary.json").read_text())["compiled"]["paired"] == clean.paired
    assert not torch.nn.modules.module._has_any_global_hook()  # no recorder hook left behind


@pytest.mark.slow
def test_compiled_dump_names_kernels_and_fused_ops(clean):
    from xray.dump import load_dump

    dump = load_dump(clean.out / "compiled")
    records = dump.header["compiled"]["records"]
    kernels = {e["kernel"] for entries in records.values() for e in entries}
    assert "extern_kernels.addmm" in kernels
    fused = [e for entries in records.values() for e in entries if e["kernel"].startswith("cpp_fused_")]
    assert any("aten.gelu.default" in e["fused_ops"] and "aten.native_layer_norm.default" in e["fused_ops"]
               for e in fused)
    ln = next(r for r in dump.records if r.op == "aten.native_layer_norm.default")
    assert records[str(ln.seq)][0]["output"] == 0  # the fused kernel's buffer is LayerNorm's out0
    gelu = next(r for r in dump.records if r.op == "aten.gelu.default")
    assert str(gelu.seq) not in records and "fused" in gelu.outputs[0].note


@pytest.mark.slow
def test_scaled_node_is_named_with_its_kernel(tmp_path):
    model, args = block()
    fault = ScaleNode(0, 1e-3)  # the first linear's addmm, scaled: fused into the next C++ kernel
    r = compile_check(model, args, out=tmp_path / "fault", config_patches={"post_grad_custom_post_pass": fault})
    assert fault.hit == "addmm"
    assert r.summary["failed"] > 0
    fd = r.first
    assert fd["kernel"].startswith("cpp_fused_") and FAULT_NODE in fd["kernel_nodes"]
    assert fd["op"] == "aten.native_layer_norm.default" and fd["module"] == "norm"
    # born there: LayerNorm's input (GELU's output) was fused away; rebuilt in float64 from the
    # addmm buffer, the kernel's local error is beyond what fp32 makes
    assert r.verdict.startswith("bug: born at aten.native_layer_norm.default") and fd["origin"] == "born"
    assert f"kernel {fd['kernel']}" in r.verdict and "gelu" in r.verdict
    from xray.dump import load_dump

    ln = next(x for x in load_dump(r.out / "compiled").records if x.op == "aten.native_layer_norm.default")
    assert ln.inputs["input"].data is not None and "recomputed in float64" in ln.inputs["input"].note
    assert ln.inputs["weight"].data is not None  # weights saved: the call can be re-run


def test_wrong_decomposition_is_named(tmp_path):
    model, args = block()
    r = compile_check(model, args, out=tmp_path / "decomp", decompositions=wrong_decompositions("gelu"))
    assert r.summary["failed"] > 0
    assert "aten.gelu.default" in r.first["kernel_ops"]
    assert r.verdict.startswith("bug: born at") and f"kernel {r.first['kernel']}" in r.verdict


@pytest.mark.slow
def test_clean_bf16_compile_is_precision(tmp_path):
    """bf16: inductor keeps fused intermediates in fp32, eager rounds each op; both are precision."""
    model, args = block()
    r = compile_check(model.to(torch.bfloat16), (args[0].to(torch.bfloat16),), out=tmp_path / "bf16")
    assert r.summary["failed"] == 0 and r.verdict.startswith("precision") and r.outputs_equal


@pytest.mark.slow
def test_cli_errors_are_one_line(tmp_path):
    for argv in (["nope_module:build"], [f"{__file__}:block", "--backend", "eager"]):
        p = subprocess.run([sys.executable, "-m", "xray.cli", "compile-check", *argv, "--out", str(tmp_path / "o")],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 2, p.stderr
        assert "Traceback" not in p.stderr and p.stderr.strip().count("\n") == 0
        assert p.stderr.startswith("xray compile-check: ")


@pytest.mark.slow
def test_real_size_llama(tmp_path):
    """A 1-layer Llama at hidden 1024 and 512 tokens: clean is precision, a 1e-3 fault is named."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=512, hidden_size=1024, intermediate_size=2816, num_hidden_layers=1,
                      num_attention_heads=16, num_key_value_heads=16, use_cache=False, attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg).eval()
    args = (torch.randint(0, 512, (1, 512), generator=torch.Generator().manual_seed(0)),)
    r = compile_check(model, args, out=tmp_path / "clean")
    assert r.summary["failed"] == 0 and r.outputs_equal
    fault = ScaleNode(3, 1e-3)
    r = compile_check(model, args, out=tmp_path / "fault", config_patches={"post_grad_custom_post_pass": fault})
    assert r.summary["failed"] > 0 and FAULT_NODE in r.first["kernel_nodes"]


class Rotary(nn.Module):
    """q/k projections, a rotary embedding (``rotate_half``'s ``cat``, which inductor writes as two
    aliased halves of one buffer) and attention (a fallback kernel with a multi-output result)."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.o = nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 32)

    @staticmethod
    def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = torch.cat((-x[..., 8:], x[..., :8]), dim=-1)
        return x * cos + half * sin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        pos = torch.arange(t, dtype=torch.float32)[:, None] * torch.arange(1, 17, dtype=torch.float32)[None] / 16
        cos, sin = pos.cos(), pos.sin()
        q = self.rope(self.q(x).view(b, t, 2, 16).transpose(1, 2), cos, sin)
        k = self.rope(self.k(x).view(b, t, 2, 16).transpose(1, 2), cos, sin)
        a = nn.functional.scaled_dot_product_attention(q, k, k, is_causal=True)
        return self.o(a.transpose(1, 2).reshape(b, t, 32))


def rotary() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    return Rotary().eval(), (torch.randn(1, 8, 32),)


def _kernels(r) -> list[dict]:
    return json.loads((r.out / "compiled" / "dump.json").read_text())["compiled"]["kernels"]


@pytest.mark.slow
def test_aliased_cat_is_probed_and_its_fault_named_at_its_kernel(tmp_path):
    model, args = rotary()
    fault = ScaleNode(0, 1e-2, op=torch.ops.aten.neg.default)
    r = compile_check(model, args, out=tmp_path / "rope", config_patches={"post_grad_custom_post_pass": fault})
    kernels = _kernels(r)
    fd, first = r.first, next(k for k in kernels if FAULT_NODE in k["nodes"])
    assert fault.hit_op == "aten.neg.default"  # rotate_half's negation: written into the cat's first half
    cat = next(k for k in kernels if any(n and n.startswith("cat") for n in k["buffers"].values()))
    assert (cat["graph"], cat["launch"]) == (first["graph"], first["launch"])  # the cat's base buffer is probed
    assert (fd["graph"], fd["launch"]) == (first["graph"], first["launch"]) and FAULT_NODE in fd["kernel_nodes"]
    assert fd["op"] in ("aten.neg.default", "aten.cat.default")
    # a fallback kernel computes its own op only, not the nodes inlined into its inputs
    sdpa = [k for k in kernels if k["kernel"].startswith("torch.ops.aten._scaled_dot_product")]
    assert sdpa and all(k["ops"] == ["aten._scaled_dot_product_flash_attention_for_cpu.default"] for k in sdpa)


@pytest.mark.slow
def test_statistics_only_keeps_statistics_not_tensors(tmp_path):
    """--statistics-only: each buffer reduced at its probe; the dump holds statistics, no tensors."""
    from xray.dump import load_dump

    model, args = block()
    r = compile_check(model, args, out=tmp_path / "stats", save_tensors=False)
    assert r.summary["failed"] == 0 and r.outputs_equal and r.paired >= 4
    dump = load_dump(r.out / "compiled")
    kept = [m for x in dump.records for _, m in x.output_tensors() if m.stats is not None and m.note is None]
    assert len(kept) >= 4 and all(m.data is None for m in kept)
    ln = next(x for x in dump.records if x.op == "aten.native_layer_norm.default")
    eager = next(x for x in load_dump(r.out / "eager").records if x.seq == ln.seq)
    assert abs(ln.outputs[0].stats.mean - eager.outputs[0].stats.mean) < 1e-5


def test_eager_backward_records_are_grouped_by_the_dynamo_node_that_made_them(tmp_path):
    """The eager reference's backward: each Dynamo node's autograd nodes note the records they make
    (group ``<node>:backward``), fed the gradients the compiled outputs received."""
    from xray.compiled.reference import DynamoGraphs, record_eager
    from xray.dump import load_dump

    model, (x,) = block()
    gm = torch.fx.symbolic_trace(model)
    x = x.clone().requires_grad_(True)
    dynamo = DynamoGraphs(graphs=[gm], runs=[(0, [x])], tangents=[[torch.ones(2, 4)]])
    ref = record_eager(dynamo, None, tmp_path / "eager", dump_num=8, backward=True)
    groups = ref.node_seqs[0]
    dump = load_dump(ref.dump)
    ops = {r.seq: r.op for r in dump.records if r.kind == "op"}
    in_group = lambda name: [ops[s] for a, b in groups[name] for s in range(a, b) if s in ops]  # noqa: E731
    assert "aten.native_layer_norm_backward.default" in in_group("norm:backward")
    assert "aten.gelu_backward.default" in in_group("gelu:backward")
    assert "aten.mm.default" in in_group("up:backward") and "aten.mm.default" in in_group("down:backward")
    assert "aten.gelu_backward.default" not in in_group("norm:backward")
    assert x.grad is None  # gradients to the inputs are computed, never accumulated


class Head(nn.Module):
    """``block`` without its final sum: a softmax summed over its own axis has a zero gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.norm, self.down = nn.Linear(16, 24), nn.LayerNorm(24), nn.Linear(24, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.down(self.norm(nn.functional.gelu(self.up(x)))) * 2, -1)


def head() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    return Head().eval(), (torch.randn(2, 4, 16),)


@pytest.mark.slow
def test_backward_graph_is_probed_paired_and_clean(tmp_path):
    model, args = head()
    r = compile_check(model, args, out=tmp_path / "bwd", backward=True)
    assert r.summary["failed"] == 0 and r.outputs_equal and r.eager_equal
    kernels = _kernels(r)
    backward = [k for k in kernels if k["backward"]]
    assert backward and any(k["kernel"] == "extern_kernels.mm" for k in backward)
    from xray.dump import load_dump

    dump = load_dump(r.out / "compiled")
    records = dump.header["compiled"]["records"]
    paired = {x.op for x in dump.records if x.direction == "backward" and str(x.seq) in records}
    # mul's backward: its forward op was folded into the softmax pattern by the joint-graph passes
    assert {"aten.mm.default", "aten.gelu_backward.default", "aten.mul.Tensor"} <= paired
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.slow
def test_backward_scale_fault_is_named_at_its_backward_kernel(tmp_path):
    model, args = head()
    fault = ScaleNode(2, 1e-3, backward=True)
    r = compile_check(model, args, out=tmp_path / "bwd-fault", backward=True,
                      config_patches={"post_grad_custom_post_pass": fault})
    assert fault.hit and r.summary["failed"] > 0
    first = next(k for k in _kernels(r) if FAULT_NODE in k["nodes"])
    assert first["backward"]
    assert (r.first["graph"], r.first["launch"]) == (first["graph"], first["launch"])
    assert r.verdict.startswith("bug: born at")


@pytest.mark.slow
def test_wrong_lowering_is_named(tmp_path):
    from xray.compiled.faults import wrong_lowering

    model, args = head()
    with wrong_lowering(torch.ops.aten.rsqrt.default) as applied:
        r = compile_check(model, args, out=tmp_path / "lowering")
    assert applied[0] > 0 and r.summary["failed"] > 0
    first = next(k for k in _kernels(r) if "aten.rsqrt.default" in k["targets"])
    assert (r.first["graph"], r.first["launch"]) == (first["graph"], first["launch"])


def test_a_buffer_written_twice_pairs_at_its_last_write():
    """An embedding's gradient: one kernel fills the buffer with zeros, a later one scatters into it
    in place; only the last write holds the node's value."""
    from xray.compiled.capture import CompiledGraph
    from xray.compiled.instrument import Launch
    from xray.compiled.mapping import last_writers

    g = CompiledGraph(0, 0, {}, {"buf0": "index_put"}, {}, launches=[
        Launch(0, "cpp_fused_zeros_0", ["buf0", "buf1"], 1), Launch(1, "extern_kernels.mm", ["buf2"], 2),
        Launch(2, "cpp_fused_index_put_1", ["buf0"], 3)])
    assert last_writers(g) == {"buf0": 2, "buf1": 0, "buf2": 1}


def test_a_backward_node_names_its_forward_dynamo_node():
    """Through the autograd sequence number when the forward graph kept it, else through the
    forward op's source function (a forward op a joint-graph pattern replaced keeps no seq_nr)."""
    from xray.compiled.capture import _node_info

    graph = torch.fx.Graph()
    x = graph.placeholder("tangents_1")
    kept = graph.call_function(torch.ops.aten.mm.default, (x, x))
    kept.meta.update(seq_nr=7, fwd_source_fn_stack=[("linear", None)], autograd_backward=True)
    folded = graph.call_function(torch.ops.aten.mul.Tensor, (x, 2))
    folded.meta.update(seq_nr=9, fwd_source_fn_stack=[("mul", None)], autograd_backward=True)
    assert _node_info(kept, {7: "linear_1"}).root == "linear_1:backward"  # seq_nr wins
    assert _node_info(folded, {7: "linear_1"}).root == "mul:backward"
    forward = graph.call_function(torch.ops.aten.relu.default, (x,))
    assert _node_info(forward, {7: "linear_1"}).root == ""  # no Dynamo node, no backward metadata


class TwoNorms(nn.Module):
    """Two Linear + ReLU + LayerNorm stages: two calls of one op kind, so a fault in every call of
    it looks like a kernel computing that kind in a reduced precision."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.mid, self.down = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 8)
        self.n1, self.n2 = nn.LayerNorm(32), nn.LayerNorm(32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.n2(torch.relu(self.mid(self.n1(torch.relu(self.up(x)))))))


@pytest.mark.slow
def test_a_lowering_wrong_on_every_call_is_a_bug_not_bf16(tmp_path):
    """rsqrt lowered 1e-3 high makes both LayerNorms err at bf16's level; an fp32 inductor compile
    on CPU rounds to no reduced precision (the dump's math says so), so it is born at the first
    LayerNorm's kernel; the clean compile of the same model passes."""
    from xray.compiled.faults import wrong_lowering
    from xray.dump import load_dump

    torch.manual_seed(0)
    model, args = TwoNorms().eval(), (torch.randn(2, 8, 16),)
    with wrong_lowering(torch.ops.aten.rsqrt.default) as applied:
        r = compile_check(model, args, out=tmp_path / "lowering")
    assert applied[0] == 2 and r.summary["failed"] > 0
    assert load_dump(r.out / "compiled").header["math"]["fp32_rounds_to"] == []
    first = next(k for k in _kernels(r) if "aten.rsqrt.default" in k["targets"])
    assert (r.first["graph"], r.first["launch"]) == (first["graph"], first["launch"])
    assert r.first["module"] == "n1" and "rsqrt" in r.first["kernel_nodes"]
    assert r.verdict.startswith("bug: born at aten.native_layer_norm.default")
    # the blamed kernel's standalone test: its fused nodes on the buffers it was fed fail the same way
    repro = r.out / r.summary["compiled"]["repro"]
    assert repro.name == f"test_repro_{r.first['kernel']}.py" and repro.with_suffix(".pt").is_file()
    fed = torch.load(repro.with_suffix(".pt"))  # the recorded values: the linear's buffer, the norm's weights
    assert any(t.shape == (2, 8, 32) or t.shape == (16, 32) for t in fed.values())
    for w in (model.n1.weight, model.n1.bias):
        assert any(torch.equal(t, w.detach()) for t in fed.values())
    test = runpy.run_path(str(repro))["test_kernel_matches_eager_within_fp32"]
    with wrong_lowering(torch.ops.aten.rsqrt.default), pytest.raises(AssertionError, match="rsqrt"):
        test()
    test()  # passes on a clean compile: the fault, not the rebuild, made it fail
    clean = compile_check(model, args, out=r.out)
    assert clean.summary["failed"] == 0 and clean.verdict.startswith("precision")
    assert clean.summary["compiled"]["repro"] is None and not list(r.out.glob("test_repro_*"))


def test_a_scale_fault_never_hits_a_constant():
    """A fill (``select_backward``'s zeros) reads no tensor: scaling it changes nothing, so it is no
    fault site; the op that reads it is."""
    from xray.compiled.faults import candidates

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.empty(4)
    zeros = graph.call_function(torch.ops.aten.full.default, ([4], 0.0))
    added = graph.call_function(torch.ops.aten.add.Tensor, (zeros, x))
    graph.output(added)
    for n in (zeros, added):
        n.meta.update(val=torch.empty(4), from_node=[object()])
    assert candidates(graph) == [added]


class KeepsState(nn.Module):
    """Returns one tensor and keeps another on itself: Dynamo's graph returns both (the state it
    updates, as a KV cache's), the model's own output only the first."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(8, 8)
        self.last: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.up(x))
        self.last = h * 2
        return h.sum(-1)


@pytest.mark.slow
def test_eager_equal_reads_the_models_outputs_among_the_graphs(tmp_path):
    torch.manual_seed(0)
    r = compile_check(KeepsState().eval(), (torch.randn(2, 8),), out=tmp_path / "state")
    assert r.eager_equal and r.outputs_equal and r.summary["failed"] == 0


@pytest.mark.slow
def test_a_lowering_crash_names_its_node_and_writes_a_repro_that_reproduces(tmp_path):
    from xray.compiled.cli import report
    from xray.compiled.faults import failing_lowering

    model, args = block()
    with failing_lowering(torch.ops.aten.exp.default):  # softmax's exp: inductor lowers it
        r = compile_check(model, args, out=tmp_path / "crash")
    k = r.crash
    assert k is not None and k.side == "compile" and k.node == "exp" and k.op == "aten.exp.default"
    assert "xray fault" in k.error and "torch.softmax" in k.stack_trace
    s = json.loads((r.out / "summary.json").read_text())
    assert s["verdict_kind"] == "crash" and s["crash"]["node"] == "exp" and s["first_divergence"]["side"] == "compile"
    assert r.verdict.startswith("crash: the compiled model fails to compile") and "Traceback" not in report(r)
    repro = str(r.out / k.repro)

    def status() -> int:
        try:
            runpy.run_path(repro, run_name="__main__")
        except SystemExit as e:
            return e.code
        return 0

    with failing_lowering(torch.ops.aten.exp.default):
        assert status() == 1  # the node alone still crashes
    assert status() == 0  # and only because of the fault


def test_fp64_check_reads_an_error_beyond_fp32(tmp_path):
    from xray.compiled.writeup import fp64_check, pad_distance

    model, args = pad_distance()
    with torch.no_grad():
        eager = model(*args)
    ok = fp64_check(model, args, [eager.clone()])
    assert ok["within_fp32"] and ok["ratio"] == pytest.approx(1.0)
    off = fp64_check(model, args, [eager * (1 + 1e-3)])
    assert not off["within_fp32"] and off["ratio"] > 10


@pytest.mark.slow
def test_writeup_examples_on_this_torch(tmp_path):
    from xray.compiled.writeup import run

    facts = run(tmp_path)
    pad = facts["pad_distance"]
    assert pad["failed"] == 0 and pad["within_fp32"] and pad["eager_rmse_vs_fp64"] > 0
    assert facts["frexp"]["crash"] is None and facts["frexp"]["bitwise_equal"]
    assert facts["frexp"]["verdict"].startswith("consistent")


@pytest.mark.slow
def test_a_kernel_failing_at_run_names_its_launch_and_node(tmp_path):
    from xray.compiled.faults import FailAtRun

    model, args = block()
    fault = FailAtRun()  # the first linear's addmm routed through an op that raises when run
    r = compile_check(model, args, out=tmp_path / "run", config_patches={"post_grad_custom_post_pass": fault})
    k = r.crash
    assert fault.hit == "addmm" and k.side == "run" and "xray fault" in k.error
    assert k.kernel == "torch.ops.xray_fault.fail_at_run.default" and k.node == FAULT_NODE and k.module == "up"
    assert json.loads((r.out / "summary.json").read_text())["first_divergence"]["side"] == "run"
    with pytest.raises(SystemExit) as e:  # the node alone: the fault's op raises in eager too, said apart (2)
        runpy.run_path(str(r.out / k.repro), run_name="__main__")
    assert e.value.code == 2
