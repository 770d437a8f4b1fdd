"""PrecisionDebugger: names, steps and ranks, backward, transparency, in-place safety, modes."""
from __future__ import annotations

import inspect
import os
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import xray
from xray.debugger import DumpPathError, SelectionError, read_module_dump
from xray.dump.module_layout import INDEX_DTYPE
from xray.dump.reader import TruncatedDumpWarning
from xray.dump.model import Source
from xray.dump.stats import tensor_stats
from xray.demo.models import tiny_llama, token_batch

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
FILE = "globalrank-0_localrank-0.h5"


@pytest.fixture(autouse=True)
def _single_process(monkeypatch):
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)


def _llama(train: bool = False) -> torch.nn.Module:
    m = tiny_llama(layers=1, hidden=32)
    return m.train() if train else m


def _names(dump, step=None) -> dict:
    return dict(dump.named_tensors(step))


def test_name_scheme_and_saved_data_match_the_model(tmp_path):
    m, ids = _llama(), token_batch()
    captured = {}
    m.model.layers[0].self_attn.q_proj.register_forward_hook(lambda mod, a, o: captured.update(q=o.clone()))
    dbg = xray.PrecisionDebugger(dump_path=tmp_path, model=m)
    with torch.no_grad():
        dbg.start()
        logits = m(ids).logits
        dbg.stop()
    assert sorted(os.listdir(tmp_path)) == [FILE, FILE.replace(".h5", "_summary.csv")]
    with xray.load_dump(tmp_path / FILE) as dump:
        assert dump.format == "xray-module" and dump.header["format_version"] == 3 and dump.complete
        names = _names(dump)
        # The root module is named by its class alone; ModelOutput is flattened (logits first).
        root_in = names["LlamaForCausalLM.0.forward_input.0"]
        assert torch.equal(dump.load_tensor(root_in), ids)
        assert torch.equal(dump.load_tensor(names["LlamaForCausalLM.0.forward_output.0"]), logits)
        q = "model.layers.0.self_attn.q_proj.Linear.0"
        assert torch.equal(dump.load_tensor(names[f"{q}.forward_output.0"]), captured["q"])
        assert torch.equal(dump.load_tensor(names[f"{q}.forward_params.weight"]),
                           m.model.layers[0].self_attn.q_proj.weight)
        meta = names[f"{q}.forward_output.0"]
        assert meta.stats == tensor_stats(captured["q"]) and meta.shape == tuple(captured["q"].shape)
        rec = next(r for r in dump.records if r.module == "model.layers.0.self_attn.q_proj")
        assert (rec.kind, rec.op, rec.call_index, rec.direction, rec.step) == ("module", "Linear", 0, "forward", 0)
        assert set(rec.inputs) == {"forward_input.0"} and len(rec.outputs) == 1  # the weight is no input
        assert set(rec.params) == {"weight"} and rec.params["weight"].source == f"param:{rec.module}.weight"
        # Execution order: a module's record precedes those of the modules it calls.
        order = [r.module for r in dump.records]
        assert order.index("model.layers.0") < order.index("model.layers.0.self_attn.q_proj")


class _Shared(torch.nn.Module):
    """One Linear used twice per forward, and a dict output: call indices and flattening."""

    def __init__(self):
        super().__init__()
        self.shared = torch.nn.Linear(8, 8)

    def forward(self, x):
        a = self.shared(x)
        return {"a": a, "pair": (self.shared(a.relu()), x)}


def test_reused_module_gets_increasing_call_index_and_nested_outputs_flatten(tmp_path):
    torch.manual_seed(0)
    m, x = _Shared(), torch.randn(3, 8)
    dbg = xray.PrecisionDebugger(dump_path=tmp_path, model=m, task="tensor")
    with torch.no_grad():
        dbg.start()
        out = m(x)
        dbg.stop()
    with read_module_dump(tmp_path / FILE) as dump:
        names = _names(dump)
        assert torch.equal(dump.load_tensor(names["shared.Linear.0.forward_output.0"]), out["a"])
        assert torch.equal(dump.load_tensor(names["shared.Linear.1.forward_output.0"]), out["pair"][0])
        assert torch.equal(dump.load_tensor(names["_Shared.0.forward_output.2"]), x)  # dict -> tuple -> 3 leaves
        assert "_Shared.0.forward_output.3" not in names


def test_steps_and_ranks_select_what_is_dumped(tmp_path, monkeypatch):
    m, ids = _llama(), token_batch()
    dbg = xray.PrecisionDebugger(dump_path=tmp_path / "a", model=m, step=[1, "3-4"], task="statistics")
    with torch.no_grad():
        for _ in range(6):
            dbg.start()
            hooked = "forward" in vars(m.model.layers[0])
            assert hooked == (dbg.current_step in (1, 3, 4))  # nothing installed outside the selection
            m(ids)
            dbg.stop()
            dbg.step()
    with read_module_dump(tmp_path / "a" / FILE) as dump:
        assert dump.steps == [1, 3, 4] and dump.header["steps"] == [1, 3, 4]
        assert {r.step for r in dump.records} == {1, 3, 4}
        # Call indices restart each step.
        assert all(r.call_index == 0 for r in dump.records if r.module == "model.norm")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    skipped = xray.PrecisionDebugger(dump_path=tmp_path / "b", model=m, rank=[0])
    skipped.start()
    assert not skipped.running and not (tmp_path / "b").exists()
    kept = xray.PrecisionDebugger(dump_path=tmp_path / "c", model=m, rank="0-1", task="statistics")
    with torch.no_grad():
        kept.start()
        m(ids)
        kept.stop()
    with read_module_dump(tmp_path / "c" / "globalrank-1_localrank-1.h5") as dump:
        assert dump.header["global_rank"] == 1 and dump.records


def _wrapped_count(m: torch.nn.Module) -> int:
    """Modules whose forward the debugger wraps (it sets ``forward`` in the instance's dict)."""
    return sum("forward" in vars(x) for x in m.modules())


def test_the_model_carries_nothing_outside_start_and_stop(tmp_path):
    m, ids = _llama(), token_batch()
    with torch.no_grad():
        expected = m(ids).logits
    signature = inspect.signature(m.model.layers[0].forward)
    dbg = xray.PrecisionDebugger(dump_path=tmp_path / "a", model=m, step="0-1", task="statistics")
    with torch.no_grad():
        dbg.start()
        assert _wrapped_count(m) == len(list(m.modules()))
        # transformers validates generate()'s keywords against the forward's signature
        assert inspect.signature(m.model.layers[0].forward) == signature
        m(ids)
        dbg.stop()
        assert _wrapped_count(m) == 0
        rows = len(dbg._writer.rows[0])
        assert torch.equal(m(ids).logits, expected)  # a forward between steps records nothing
        assert len(dbg._writer.rows[0]) == rows
        dbg.step()
        dbg.start(); m(ids); dbg.stop()
        assert _wrapped_count(m) == 0
        dbg.step()
    with read_module_dump(tmp_path / "a" / FILE) as dump:
        assert dump.steps == [0, 1]
        per_step = [sum(1 for r in dump.rows(s)) for s in (0, 1)]
        assert per_step[0] == per_step[1] == rows
    with torch.no_grad():
        with xray.PrecisionDebugger(dump_path=tmp_path / "c", model=m, task="statistics"):
            assert _wrapped_count(m) == len(list(m.modules()))
            m(ids)
    assert _wrapped_count(m) == 0


def test_a_forward_set_on_the_instance_is_captured_and_given_back(tmp_path):
    """Another tool (accelerate's hooks, a user's patch) may have set ``forward`` on the
    instance: it is wrapped, runs, and is back in place after stop(). One replaced during a
    step is left to whoever replaced it, and every later step still captures the module once:
    through a new wrapper if theirs dropped ours, through ours if theirs wraps it."""
    import functools

    m, ids = _llama(), token_batch()
    mlp, norm, final = m.model.layers[0].mlp, m.model.layers[0].input_layernorm, m.model.norm
    seen = []

    def patched(x, _orig=mlp.forward):
        seen.append(x.shape)
        return _orig(x)

    mlp.forward = patched
    dbg = xray.PrecisionDebugger(dump_path=tmp_path, model=m, task="statistics", flush_secs=3600)

    def names(step, module):  # both steps' rows are still held: only the first stop() wrote
        return [row[0] for row in dbg._writer.csv_rows(step) if row[0].startswith(module + ".") and "output" in row[0]]

    with torch.no_grad():
        dbg.start(); m(ids)
        dropped = final.forward = lambda x, _f=type(final).forward.__get__(final): _f(x)
        ours = vars(norm)["forward"]
        kept = norm.forward = functools.wraps(ours)(lambda *a, **k: ours(*a, **k))
        dbg.stop(); dbg.step()
        assert vars(mlp)["forward"] is patched and len(seen) == 1
        assert vars(final)["forward"] is dropped and vars(norm)["forward"] is kept
        dbg.start(); m(ids); dbg.stop()
    assert names(0, "model.layers.0.mlp.LlamaMLP.0") == ["model.layers.0.mlp.LlamaMLP.0.forward_output.0"]
    for step in (0, 1):
        assert names(step, "model.norm.LlamaRMSNorm.0") == ["model.norm.LlamaRMSNorm.0.forward_output.0"]
        assert names(step, "model.layers.0.input_layernorm.LlamaRMSNorm.0") == [
            "model.layers.0.input_layernorm.LlamaRMSNorm.0.forward_output.0"]
    assert vars(final)["forward"] is dropped and vars(norm)["forward"] is kept


def _train_step(m, ids, dbg=None):
    m.zero_grad(set_to_none=True)
    if dbg:
        dbg.start()
    logits = m(ids).logits
    logits.float().pow(2).mean().backward()
    if dbg:
        dbg.stop()
    return logits.detach(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


def test_backward_names_and_bitwise_transparency(tmp_path):
    ids = token_batch()
    ref_logits, ref_grads = _train_step(_llama(train=True), ids)
    m = _llama(train=True)
    dbg = xray.PrecisionDebugger(dump_path=tmp_path, model=m)
    logits, grads = _train_step(m, ids, dbg)
    # Transparent: outputs and every gradient bitwise identical with and without the debugger.
    assert torch.equal(logits, ref_logits)
    assert grads.keys() == ref_grads.keys() and all(torch.equal(grads[k], ref_grads[k]) for k in grads)
    with read_module_dump(tmp_path / FILE) as dump:
        names = _names(dump)
        o = "model.layers.0.self_attn.o_proj.Linear.0"
        w = m.model.layers[0].self_attn.o_proj.weight
        assert torch.equal(dump.load_tensor(names[f"{o}.params_grad.weight"]), w.grad)
        g_out = dump.load_tensor(names[f"{o}.backward_input.0"])
        g_in = dump.load_tensor(names[f"{o}.backward_output.0"])
        # o_proj's input has no other consumer, so its gradient is dL/dx = dL/dy @ W.
        # Tolerance: a separately launched matmul may sum in another order (float32, ~1e-6 relative).
        torch.testing.assert_close(g_in, g_out @ w.detach(), rtol=1e-5, atol=1e-7)
        bw = [r for r in dump.records if r.direction == "backward"]
        assert bw and all(r.step == 0 for r in bw)
        fw_seq = max(r.seq for r in dump.records if r.direction == "forward")
        assert min(r.seq for r in bw) > fw_seq


def test_inplace_relu_after_norm_keeps_saved_output_and_gradients(tmp_path):
    torch.manual_seed(0)
    make = lambda: torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.LayerNorm(6),  # noqa: E731
                                       torch.nn.ReLU(inplace=True), torch.nn.Linear(6, 2))
    m, ref = make(), make()
    ref.load_state_dict(m.state_dict())
    x = torch.randn(4, 6, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    ref(x_ref).sum().backward()
    norm_out = ref[1](ref[0](x_ref)).detach()  # the LayerNorm output before ReLU overwrites it
    dbg = xray.PrecisionDebugger(dump_path=tmp_path, model=m)
    dbg.start()
    m(x).sum().backward()
    dbg.stop()
    assert torch.equal(x.grad, x_ref.grad)
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(m.parameters(), ref.parameters()))
    with read_module_dump(tmp_path / FILE) as dump:
        names = _names(dump)
        saved = dump.load_tensor(names["1.LayerNorm.0.forward_output.0"])
        assert torch.equal(saved, norm_out) and (saved < 0).any()
        assert names["1.LayerNorm.0.forward_output.0"].stats.min < 0
        assert "1.LayerNorm.0.backward_output.0" in names and "1.LayerNorm.0.params_grad.weight" in names


def test_statistics_only_saves_no_tensor_data(tmp_path):
    m, ids = _llama(), token_batch()
    dbg = xray.PrecisionDebugger(dump_path=tmp_path, model=m, task="statistics")
    with torch.no_grad():
        dbg.start()
        logits = m(ids).logits
        dbg.stop()
    with read_module_dump(tmp_path / FILE) as dump:
        meta = _names(dump)["LlamaForCausalLM.0.forward_output.0"]
        assert meta.data is None and not dump.has_data(meta) and meta.stats == tensor_stats(logits)
        with pytest.raises(KeyError):
            dump.load_tensor(meta)
    with h5py.File(tmp_path / FILE) as f:
        assert list(f["step_0"].keys()) == ["index"]


def test_non_ascii_module_names_round_trip(tmp_path):
    """The index stores names as fixed-length UTF-8 (width in bytes, not characters)."""
    m = torch.nn.Sequential()
    m.add_module("größe", torch.nn.Linear(3, 3))
    m.add_module("层", torch.nn.ReLU())
    dbg = xray.PrecisionDebugger(dump_path=tmp_path, model=m, task="statistics")
    with torch.no_grad():
        dbg.start()
        out = m(torch.randn(2, 3))
        dbg.stop()
    with read_module_dump(tmp_path / FILE) as dump:
        names = _names(dump)
        assert names["层.ReLU.0.forward_output.0"].stats == tensor_stats(out)
        assert {r.module for r in dump.rows()} == {"", "größe", "层"}


def test_reads_format_1_files_without_the_keyword_column(tmp_path):
    """Version 1 wrote variable-length strings and had no ``keyword`` column: rewrite a fresh
    dump that way and read it back (keyword tensors then count as positional)."""
    m, ids = _llama(), token_batch()
    dbg = xray.PrecisionDebugger(dump_path=tmp_path, model=m, task="statistics")
    with torch.no_grad():
        dbg.start()
        m(ids)
        dbg.stop()
    with read_module_dump(tmp_path / FILE) as dump:
        want = [(r.name, r.meta.stats) for r in dump.rows()]
        assert any(r.keywords for r in dump.records)
    v1 = np.dtype([(n, INDEX_DTYPE[n]) for n in INDEX_DTYPE.names if n not in ("keyword", "source")])
    with h5py.File(tmp_path / FILE, "a") as f:
        table = f["step_0/index"][()]
        old = np.array([tuple(c.decode() if isinstance(c, bytes) else c for c in row)[:len(v1)] for row in table.tolist()],
                       dtype=v1)
        del f["step_0/index"]
        f["step_0"].create_dataset("index", data=old)
        f.attrs["format_version"] = 1
    with read_module_dump(tmp_path / FILE) as dump:
        assert [(r.name, r.meta.stats) for r in dump.rows()] == want
        assert not any(r.keywords for r in dump.records)
        # parameters of an old file are still parameters, named by their module's path
        q = next(r for r in dump.records if r.module == "model.layers.0.self_attn.q_proj")
        assert q.params["weight"].source == "param:model.layers.0.self_attn.q_proj.weight"
        assert not any(k.startswith("forward_params") for r in dump.records for k in r.inputs)


class _Stateful(torch.nn.Module):
    """Parameters, buffers and a weight tied across two modules (named as named_parameters names it)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 8)
        self.norm = torch.nn.BatchNorm1d(8)
        self.proj = torch.nn.Linear(8, 10, bias=False)
        self.proj.weight = self.embed.weight

    def forward(self, ids):
        return self.proj(self.norm(self.embed(ids)))


def test_parameters_and_buffers_are_recorded_as_parameters_never_inputs(tmp_path):
    torch.manual_seed(0)
    m = _Stateful().eval()
    ids = torch.tensor([1, 2, 3])
    dbg = xray.PrecisionDebugger(dump_path=tmp_path, model=m, backward=False)
    with torch.no_grad():
        dbg.start()
        m(ids)
        dbg.stop()
    with read_module_dump(tmp_path / FILE) as dump:
        by_module = {r.module: r for r in dump.records}
        proj, norm = by_module["proj"], by_module["norm"]
        assert set(proj.inputs) == {"forward_input.0"} and set(norm.inputs) == {"forward_input.0"}
        assert proj.params["weight"].source == "param:embed.weight"  # tied: one parameter, one name
        assert {k: v.source for k, v in norm.params.items()} == {
            "weight": "param:norm.weight", "bias": "param:norm.bias", "running_mean": "buffer:norm.running_mean",
            "running_var": "buffer:norm.running_var", "num_batches_tracked": "buffer:norm.num_batches_tracked"}
        assert torch.equal(dump.load_tensor(norm.params["running_var"]), m.norm.running_var)
        # the .h5 index and the summary CSV still list them, under their role
        names = {r.name for r in dump.rows()}
        assert {"norm.BatchNorm1d.0.forward_params.weight", "norm.BatchNorm1d.0.forward_buffers.running_mean"} <= names


def test_the_shipped_version_2_module_dump_reads_parameters_as_parameters():
    """dumps/llama-module.h5 was written by format version 2 (no ``source`` column, no buffers)."""
    path = Path(__file__).resolve().parents[1] / "dumps" / "llama-module.h5"
    with read_module_dump(path) as dump:
        assert dump.header["format_version"] == 2
        linear = next(r for r in dump.records if r.op == "Linear" and r.direction == "forward")
        assert "weight" in linear.params and not any("params" in k for k in linear.inputs)
        assert linear.params["weight"].source == f"param:{linear.module}.weight"


class _Blowup(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.pre = torch.nn.Linear(4, 4)
        self.div = _Div()
        self.post = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.post(self.div(self.pre(x)))


class _Div(torch.nn.Module):
    def forward(self, x):
        return x / (x - x)  # 0/0 and x/0: NaN and Inf appear here first


def test_overflow_check_reports_first_module_and_records_only_nonfinite(tmp_path, capsys):
    torch.manual_seed(0)
    m = _Blowup()
    dbg = xray.PrecisionDebugger(dump_path=tmp_path, model=m, hook_name="overflow_check")
    with torch.no_grad():
        dbg.start()
        m(torch.randn(2, 4))
        dbg.stop()
    assert dbg.first_overflow is not None and dbg.first_overflow.name == "div._Div.0.forward_output.0"
    assert "div._Div.0.forward_output.0" in capsys.readouterr().err
    with read_module_dump(tmp_path / FILE) as dump:
        names = _names(dump)
        assert names and all(not meta.stats.finite for meta in names.values())
        assert "pre.Linear.0.forward_output.0" not in names and "div._Div.0.forward_input.0" not in names


def test_dump_torch_api_records_aten_ops_under_their_module(tmp_path):
    m, ids = _llama(), token_batch()
    dbg = xray.PrecisionDebugger(dump_path=tmp_path, model=m, dump_torch_api=True, task="statistics")
    with torch.no_grad():
        dbg.start()
        m(ids)
        dbg.stop()
    with read_module_dump(tmp_path / FILE) as dump:
        ops = [r for r in dump.records if r.kind == "op"]
        q_ops = [r for r in ops if r.module == "model.layers.0.self_attn.q_proj"]
        assert q_ops and any(r.op.startswith(("aten.mm", "aten.addmm", "aten.linear")) for r in q_ops)
        # ops and module calls share one order: q_proj's ops come right after its module record
        q_rec = next(r for r in dump.records if r.kind == "module" and r.module == "model.layers.0.self_attn.q_proj")
        assert all(r.seq > q_rec.seq and r.step == 0 for r in q_ops)
        assert all(r.outputs[0].stats is not None for r in q_ops if r.outputs)
        # the module dump's own statistics were not traced as model ops
        assert not any(r.op.startswith("aten.aminmax") for r in ops)
        # op sources use the dump's numbering: each names an earlier op record with that output
        by_seq = {r.seq: r for r in ops}
        sources = [Source.parse(m.source) for r in ops for _, m in r.input_tensors()]
        produced = [s for s in sources if s.kind == "op"]
        assert len(produced) > len(ops) // 2
        for src, (r, meta) in zip(sources, [(r, m) for r in ops for _, m in r.input_tensors()]):
            if src.kind == "op":
                producer = [m for _, m in by_seq[src.seq].output_tensors()][src.index]
                assert src.seq < r.seq and producer.shape == meta.shape, (src, r.name)


def test_bad_input_errors(tmp_path):
    with pytest.raises(TypeError, match="nn.Module"):
        xray.PrecisionDebugger(dump_path=tmp_path, model="not a model")
    with pytest.raises(SelectionError, match="'4-x'"):
        xray.PrecisionDebugger(dump_path=tmp_path, model=torch.nn.Linear(2, 2), step=[1, "4-x"])
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(DumpPathError, match="dump_path"):
        xray.PrecisionDebugger(dump_path=blocker / "sub", model=torch.nn.Linear(2, 2))


def test_unfinished_dump_never_looks_valid(tmp_path):
    m = torch.nn.Linear(2, 2)
    dbg = xray.PrecisionDebugger(dump_path=tmp_path, model=m)
    dbg.start()
    m(torch.ones(1, 2))
    assert not (tmp_path / FILE).exists() and (tmp_path / (FILE + ".tmp")).exists()
    dbg.stop()
    assert (tmp_path / FILE).exists() and not (tmp_path / (FILE + ".tmp")).exists()
    with h5py.File(tmp_path / FILE, "a") as f:  # what a writer killed mid-step leaves behind
        f.attrs["complete"] = False
    with pytest.warns(TruncatedDumpWarning, match="never finished"):
        dump = read_module_dump(tmp_path / FILE)
    assert not dump.complete
    dump.close()


@pytest.mark.parametrize("flush_secs", [0, 3600])
def test_summary_csv_written_per_step_equals_xray_summary(tmp_path, flush_secs):
    """The debugger appends each step's rows as it stops; the result must equal what
    xray-summary --csv derives from the finished file (also when a step is captured twice,
    and whether the file was written at every stop or only at the first and at close)."""
    from xray.summary.cli import main as summary_main

    m, ids = _llama(), token_batch()
    dbg = xray.PrecisionDebugger(dump_path=tmp_path / "d", model=m, task="statistics", flush_secs=flush_secs)
    with torch.no_grad():
        for step in range(3):
            for _ in range(2 if step == 1 else 1):  # step 1 is captured twice
                dbg.start()
                m(ids)
                dbg.stop()
            dbg.step()
    written = (tmp_path / "d" / FILE.replace(".h5", "_summary.csv")).read_text()
    dbg.close()
    assert summary_main([str(tmp_path / "d" / FILE), str(tmp_path / "again.csv"), "--csv"]) == 0
    assert written == (tmp_path / "again.csv").read_text()


def test_summary_csv_keeps_the_sign_of_zero(tmp_path):
    """The CSV formats each distinct (min, max, mean, std) once; -0.0 equals 0.0 as a key, yet
    a tensor of -0.0 must read "-0" and one of +0.0 "0", exactly as xray-summary writes them."""
    from xray.summary.cli import main as summary_main

    m = torch.nn.Sequential(torch.nn.Identity(), torch.nn.Identity())
    dbg = xray.PrecisionDebugger(dump_path=tmp_path / "d", model=m, task="statistics")
    dbg.start()
    m(torch.zeros(3))
    m(torch.full((3,), -0.0))
    dbg.stop()
    written = (tmp_path / "d" / FILE.replace(".h5", "_summary.csv")).read_text()
    assert summary_main([str(tmp_path / "d" / FILE), str(tmp_path / "again.csv"), "--csv"]) == 0
    assert written == (tmp_path / "again.csv").read_text()
    assert ",-0,-0,-0,0," in written and ",0,0,0,0," in written


def test_summary_csv_quotes_odd_module_names_like_csv_writer(tmp_path):
    """Module names may hold commas, quotes and newlines (ModuleDict keys); the per-step CSV
    formats most rows itself, so these rows must come out exactly as csv.writer writes them,
    and a tensor without finite elements leaves its statistics cells empty."""
    import pandas as pd
    from xray.summary.cli import main as summary_main

    odd = ['a,b', 'say "hi"', 'two\nlines', 'plain']
    m = torch.nn.ModuleDict({k: torch.nn.Linear(2, 2) for k in odd})
    dbg = xray.PrecisionDebugger(dump_path=tmp_path / "d", model=m, task="statistics")
    dbg.start()
    with torch.no_grad():
        for k in odd:
            m[k](torch.full((1, 2), float("nan")) if k == "plain" else torch.ones(1, 2))
    dbg.stop()
    written = (tmp_path / "d" / FILE.replace(".h5", "_summary.csv")).read_text()
    assert summary_main([str(tmp_path / "d" / FILE), str(tmp_path / "again.csv"), "--csv"]) == 0
    assert written == (tmp_path / "again.csv").read_text()
    table = pd.read_csv(tmp_path / "again.csv", keep_default_na=False)
    # a control character in a name is escaped in every CSV (as on a terminal): "\n" reads as two characters
    assert [n.split(".Linear.")[0] for n in table["Module"][::4]] == [k.replace("\n", "\\n") for k in odd]
    nan_input = table[table["Module"] == "plain.Linear.0.forward_input.0"].iloc[0]
    assert nan_input["Min"] == "" and nan_input["NaN"] == 2


def test_flatten_fast_paths_number_as_the_walk_does():
    """flatten_tensors short-cuts a bare tensor, None and a one-tensor tuple, flatten_kwargs
    skips plain values; every shape of input must still get the walk's numbering."""
    from xray.record.flatten import _walk, flatten_kwargs, flatten_tensors

    a, b, c = torch.ones(1), torch.zeros(2), torch.nn.Parameter(torch.ones(3))
    cases = [a, None, (a,), (c,), (a, b), [a], ((a, b),), {"x": a, "y": (b, None, c)}, (None,), (1, a), "text", ()]
    for value in cases:
        walked: list = []
        _walk(value, walked)
        got = flatten_tensors(value)
        assert [id(t) for t in got] == [id(t) for t in walked], value
    # Keyword arguments: each tensor with its keyword, numbered as the walk over the dict.
    kwargs = {f"k{i}": v for i, v in enumerate(cases)} | {"flag": True, "n": 3, "none": None}
    walked = []
    _walk(kwargs, walked)
    pairs = flatten_kwargs(kwargs)
    assert [id(t) for _, t in pairs] == [id(t) for t in walked]
    assert [k for k, _ in pairs] == [k for k, v in kwargs.items() for _ in flatten_tensors(v)]


def _steps_in_file(path) -> list[int]:
    with read_module_dump(path) as dump:
        assert dump.complete
        return dump.steps


def _csv_steps(folder) -> set[int]:
    import pandas as pd

    return set(pd.read_csv(folder / FILE.replace(".h5", "_summary.csv"))["Step"])


def test_statistics_index_is_written_every_flush_secs_and_the_csv_every_step(tmp_path, monkeypatch):
    """flush_secs=0 writes the file at every stop(). A long flush_secs writes it at the first
    stop(), at the last selected step, at flush() and close(): in between the file stays
    complete and valid with the steps written so far, while the CSV already has every step."""
    m, ids = _llama(), token_batch()
    eager = xray.PrecisionDebugger(dump_path=tmp_path / "e", model=m, task="statistics", flush_secs=0)
    lazy = xray.PrecisionDebugger(dump_path=tmp_path / "l", model=m, task="statistics", flush_secs=3600)
    with torch.no_grad():
        for step in range(3):
            for dbg in (eager, lazy):
                dbg.start(); m(ids); assert dbg.stop() == (dbg.file if dbg is eager or step == 0 else None)
                dbg.step()
            assert _steps_in_file(eager.file) == list(range(step + 1))
            assert _steps_in_file(lazy.file) == [0]
            assert _csv_steps(tmp_path / "l") == set(range(step + 1))
        assert lazy.flush() == lazy.file and _steps_in_file(lazy.file) == [0, 1, 2]
        lazy.start(); m(ids); lazy.stop()
        lazy.close()
    assert _steps_in_file(lazy.file) == [0, 1, 2, 3]
    with read_module_dump(eager.file) as a, read_module_dump(lazy.file) as b:
        assert [r.name for r in a.rows(2)] == [r.name for r in b.rows(2)]
    # A bound on the rows held writes the file whatever flush_secs says (memory stays bounded).
    bounded = xray.PrecisionDebugger(dump_path=tmp_path / "b", model=m, task="statistics", flush_secs=3600)
    with monkeypatch.context() as patch, torch.no_grad():
        patch.setattr("xray.debugger.debugger.MAX_HELD_ROWS", 1)
        for step in range(3):
            bounded.start(); m(ids); bounded.stop(); bounded.step()
            assert _steps_in_file(bounded.file) == list(range(step + 1))
    # The last selected step writes the file, whatever flush_secs says.
    last = xray.PrecisionDebugger(dump_path=tmp_path / "s", model=m, task="statistics", step="0-2", flush_secs=3600)
    with torch.no_grad():
        for _ in range(4):
            last.start(); m(ids); last.stop(); last.step()
    assert _steps_in_file(last.file) == [0, 1, 2]
    with pytest.raises(ValueError, match="flush_secs"):
        xray.PrecisionDebugger(dump_path=tmp_path / "x", model=m, flush_secs=-1)
    with pytest.raises(RuntimeError, match="between steps"):
        with xray.PrecisionDebugger(dump_path=tmp_path / "y", model=m) as running:
            running.flush()


_EXIT_SCRIPT = """
import sys, torch, xray
from xray.demo.models import tiny_llama, token_batch
m, ids = tiny_llama(layers=1, hidden=32), token_batch()
norm = m.model.norm
def boom(mod, args):
    if dbg.current_step == 2:
        raise RuntimeError("device fault")
norm.register_forward_pre_hook(boom)
dbg = xray.PrecisionDebugger(dump_path=sys.argv[1], model=m, task="statistics", flush_secs=3600)
with torch.no_grad():
    for _ in range(3):
        dbg.start(); m(ids); dbg.stop(); dbg.step()
"""


@pytest.mark.slow
def test_rows_in_memory_reach_the_file_when_the_program_dies_of_an_exception(tmp_path):
    """No close(): steps 1 and 2 are only in memory when step 2's forward raises. Python's exit
    writes them, the failing step with the rows captured before the fault (what one needs to
    find it), and the file is complete."""
    import subprocess
    import sys

    script = tmp_path / "run.py"
    script.write_text(_EXIT_SCRIPT)
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "d")], capture_output=True, text=True,
                         env=dict(os.environ, TRANSFORMERS_VERBOSITY="error"), timeout=300)
    assert out.returncode == 1 and "device fault" in out.stderr and "could not write" not in out.stderr
    with read_module_dump(tmp_path / "d" / FILE) as dump:
        assert dump.complete and dump.steps == [0, 1, 2]
        full, cut = [r.name for r in dump.rows(1)], [r.name for r in dump.rows(2)]
        assert len(cut) < len(full) and cut == full[:len(cut)]
        assert not any(n.startswith("model.norm.") for n in cut) and any(n.startswith("model.layers.0.") for n in cut)


def test_held_rows_are_written_when_the_debugger_is_collected_but_never_into_a_removed_folder(tmp_path):
    import gc
    import shutil

    m, ids = _llama(), token_batch()
    for name in ("kept", "removed"):
        dbg = xray.PrecisionDebugger(dump_path=tmp_path / name, model=m, task="statistics", flush_secs=3600)
        with torch.no_grad():
            for _ in range(2):
                dbg.start(); m(ids); dbg.stop(); dbg.step()
        assert _steps_in_file(tmp_path / name / FILE) == [0]
        if name == "removed":
            shutil.rmtree(tmp_path / name)
        del dbg
        gc.collect()
    assert _steps_in_file(tmp_path / "kept" / FILE) == [0, 1]
    assert not (tmp_path / "removed").exists()
