"""Data edges in trace dumps (format v2, issue 17): every recorded input names its producer."""
from __future__ import annotations

import gc
import json
import warnings

import pytest
import torch

import xray
from xray.dump.json_index import rewrite_as_json
from xray.dump import TruncatedDumpWarning
from xray.dump.model import Source
from xray.record.producers import Producers

Q_PROJ = "model.layers.0.self_attn.q_proj"


def record(fn, tmp_path, **kw):
    kw.setdefault("X_DEDUP", False)
    with xray.dump(dump_dir=tmp_path, **kw) as session:
        out = fn()
    return out, xray.load_dump(session.folder)


def op_records(dump):
    return {r.seq: r for r in dump.records if r.kind == "op"}


def llama_step(model, ids):
    model.zero_grad()
    loss = model(ids, labels=ids).loss
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.fixture(scope="module")
def llama_backward(tmp_path_factory):
    """A real transformers Llama (2 layers, hidden 64), forward + backward recorded without
    de-duplication, with module records; also the same step run without recording."""
    from xray.demo.models import tiny_llama, token_batch

    ids = token_batch(batch=2, seq=8)
    model = tiny_llama(layers=2, hidden=64).train()
    eager = llama_step(model, ids)
    recorded, dump = record(lambda: llama_step(model, ids), tmp_path_factory.mktemp("llama"), X_DEBUG=0x11A)
    return eager, recorded, dump


def test_recording_stays_bitwise_transparent(llama_backward):
    (loss0, grads0), (loss1, grads1), _ = llama_backward
    assert torch.equal(loss0, loss1)
    assert len(grads0) == len(grads1) and all(torch.equal(a, b) for a, b in zip(grads0, grads1))


def test_every_op_source_names_an_earlier_output_of_the_same_shape(llama_backward):
    *_, dump = llama_backward
    ops = op_records(dump)
    kinds = set()
    assert any(r.direction == "backward" for r in ops.values())
    for r in ops.values():
        for name, meta in r.input_tensors():
            src = Source.parse(meta.source)
            assert src is not None, f"{r.name} {name} has no source"
            kinds.add(src.kind)
            if src.kind != "op":
                continue
            assert src.seq < r.seq, f"{r.name} {name}: producer {src} is not earlier"
            producer = ops.get(src.seq)
            assert producer is not None, f"{r.name} {name}: no record {src.seq}"
            outs = [m for _, m in producer.output_tensors()]
            assert len(outs) > src.index, f"{r.name} {name}: {producer.name} has {len(outs)} outputs"
            out = outs[src.index]
            assert (out.shape, out.dtype) == (meta.shape, meta.dtype), f"{r.name} {name} vs {producer.name}"
    assert kinds == {"op", "param", "buffer", "input"}


def test_module_record_sources_name_op_outputs_and_qualified_state(llama_backward):
    *_, dump = llama_backward
    ops = op_records(dump)
    modules = [r for r in dump.records if r.kind == "module"]
    assert modules and any(r.params for r in modules)
    for r in modules:
        for name, meta in r.input_tensors():
            src = Source.parse(meta.source)
            assert src.kind in ("op", "input"), f"{r.name} {name}: {src}"
            if src.kind == "op":
                assert _has_output(ops[src.seq], src.index, meta), f"{r.name} {name}"
        for name, meta in r.params.items():
            qualified = f"{r.module}.{name}" if r.module else name
            assert meta.source in (f"param:{qualified}", f"buffer:{qualified}"), f"{r.name} {name}"


def test_dedup_sources_name_a_record_or_a_call_folded_into_one(llama, tokens, tmp_path, one_record_per_key):
    with torch.no_grad():
        _, dump = record(lambda: llama(tokens), tmp_path, X_DEDUP=True)
    ops = op_records(dump)
    folded = 0
    for r in ops.values():
        for name, meta in r.input_tensors():
            src = Source.parse(meta.source)
            if src.kind != "op":
                continue
            producer = ops.get(src.seq)
            if producer is None:  # folded into the first call of its signature (which one the
                folded += 1  # dump does not say: records' seq ranges overlap)
                assert any(p.count > 1 and p.seq < src.seq <= p.last_seq and _has_output(p, src.index, meta)
                           for p in ops.values()), f"{r.name} {name}: no record could hold {src}"
            else:
                assert _has_output(producer, src.index, meta), f"{r.name} {name}"
    assert folded, "a layer repeats a signature fed alike: some producers are folded calls"


def _has_output(record, index: int, meta) -> bool:
    outs = [m for _, m in record.output_tensors()]
    return len(outs) > index and (outs[index].shape, outs[index].dtype) == (meta.shape, meta.dtype)


def _producer_chain_reaches(ops, meta, wanted: str) -> bool:
    """The source is ``wanted``, directly or through view ops (t, view, ...) whose input is."""
    for _ in range(4):
        if meta.source == wanted:
            return True
        src = Source.parse(meta.source)
        if src.kind != "op":
            return False
        producer = ops[src.seq]
        if producer.op.split(".")[1] not in ("t", "view", "transpose", "permute", "expand", "_unsafe_view",
                                            "detach", "alias"):
            return False
        meta = producer.inputs["self"]
    return False


def test_linear_weight_traces_to_its_parameter(llama_backward):
    *_, dump = llama_backward
    ops = op_records(dump)
    matmuls = [r for r in ops.values() if r.module == Q_PROJ and r.direction == "forward"
               and r.op.split(".")[1] in ("mm", "addmm", "linear", "matmul", "bmm")]
    assert matmuls
    wanted = f"param:{Q_PROJ}.weight"
    assert any(_producer_chain_reaches(ops, m, wanted) for r in matmuls for _, m in r.input_tensors())


def test_token_ids_are_model_inputs_and_rope_frequencies_a_buffer(llama_backward):
    *_, dump = llama_backward
    emb = [r for r in dump.records if r.op == "aten.embedding.default"]
    assert emb and emb[0].inputs["indices"].source == "input"
    assert emb[0].inputs["weight"].source == "param:model.embed_tokens.weight"
    assert any(m.source == "buffer:model.rotary_emb.inv_freq" for r in dump.records for _, m in r.input_tensors())


def test_module_records_carry_their_own_state_as_params_not_inputs(llama_backward):
    *_, dump = llama_backward
    q = [r for r in dump.records if r.kind == "module" and r.module == Q_PROJ]
    assert q and set(q[0].params) == {"weight"}
    assert q[0].params["weight"].source == f"param:{Q_PROJ}.weight"
    assert q[0].params["weight"].shape == (64, 64) and q[0].params["weight"].stats is not None
    assert all(not m.source.startswith(("param:", "buffer:")) for _, m in q[0].input_tensors())
    assert Source.parse(q[0].inputs["input.0"].source).kind == "op"  # the layer norm's output
    norm = [r for r in dump.records if r.kind == "module" and r.module == "model.norm"][0]
    assert norm.params["weight"].source == "param:model.norm.weight"
    layer = [r for r in dump.records if r.kind == "module" and r.module == "model.layers.0"][0]
    assert layer.params == {}  # a container's parameters belong to its submodules' records


def test_in_place_and_out_calls_become_the_latest_producer(tmp_path):
    a = torch.randn(5)

    def fn():
        x = a + 1
        x.mul_(2)  # re-produces x
        y = x.exp()
        out = torch.empty(5)
        torch.add(a, x, out=out)
        return y, out.neg(), torch.cat([x, out])

    _, dump = record(fn, tmp_path)
    seq = {r.op: r.seq for r in dump.records}
    by_op = {r.op: r for r in dump.records}
    assert by_op["aten.add.Tensor"].inputs["self"].source == "input"
    assert by_op["aten.mul_.Tensor"].inputs["self"].source == f"op:{seq['aten.add.Tensor']}:0"
    assert by_op["aten.exp.default"].inputs["self"].source == f"op:{seq['aten.mul_.Tensor']}:0"
    assert by_op["aten.add.out"].inputs["out"].source == f"op:{seq['aten.empty.memory_format']}:0"
    assert by_op["aten.neg.default"].inputs["self"].source == f"op:{seq['aten.add.out']}:0"
    assert [m.source for _, m in by_op["aten.cat.default"].input_tensors()] == [
        f"op:{seq['aten.mul_.Tensor']}:0", f"op:{seq['aten.add.out']}:0"]


def test_list_outputs_are_numbered_item_by_item(tmp_path):
    x = torch.randn(4, 6)
    _, dump = record(lambda: [p.sum() for p in torch.split(x, 2, dim=1)], tmp_path)
    split = [r for r in dump.records if r.op == "aten.split.Tensor"][0]
    sums = [r for r in dump.records if r.op == "aten.sum.default"]
    assert [r.inputs["self"].source for r in sums] == [f"op:{split.seq}:{k}" for k in range(3)]


@pytest.mark.usefixtures("one_record_per_key")
def test_dedup_folded_calls_still_produce_under_their_own_seq(tmp_path):
    x = torch.randn(3)

    def fn():
        _a = x.exp()
        b = x.exp()  # same signature: folded into a's record
        return b.neg()

    _, dump = record(fn, tmp_path, X_DEDUP=True)
    exp = [r for r in dump.records if r.op == "aten.exp.default"]
    assert len(exp) == 1 and exp[0].count == 2
    (neg,) = [r for r in dump.records if r.op == "aten.neg.default"]
    src = Source.parse(neg.inputs["self"].source)
    assert src.seq == exp[0].last_seq != exp[0].seq and src.seq not in {r.seq for r in dump.records}


def test_producer_map_keeps_nothing_alive_and_survives_id_reuse():
    """A new tensor object under a dead one's id (and data pointer: a view of the same base)
    does not inherit the dead one's producer."""
    producers = Producers()
    base = torch.randn(3)
    t = base.view(3)
    producers.produced(7, ("aten.view.default",), t)
    assert producers.source_of(t) == "op:7:0"
    ref, old_id = torch.utils.weak.WeakRef(t), id(t)
    del t
    gc.collect()
    assert ref() is None  # the map held no reference
    held = []  # kept alive, so the allocator moves on until it hands out the freed slot
    for _ in range(10000):
        reused = base.view(3)
        if id(reused) == old_id:
            assert reused.data_ptr() == base.data_ptr()
            assert producers.source_of(reused) == "input"
            break
        held.append(reused)
    else:
        pytest.skip("the allocator never reused the id")


def test_data_swap_and_module_state_names():
    producers = Producers()
    x = torch.randn(3)
    producers.produced(1, ("aten.split.Tensor",), [x])
    x.data = torch.randn(3)  # no ATen call: the old producer no longer holds
    assert producers.source_of(x) == "input"
    lin = torch.nn.Linear(2, 2)
    producers.name_state(lin.weight, "param", "lin.weight")
    producers.produced(9, ("aten._foreach_add_.List",), [lin.weight])  # an in-place update (optimizer step) keeps the name
    assert producers.source_of(lin.weight) == "param:lin.weight"


def _downgrade_to_v1(obj: dict) -> dict:
    """What a version-1 writer produced: no "src", no "params"."""
    if isinstance(obj, dict):
        return {k: _downgrade_to_v1(v) for k, v in obj.items() if k not in ("src", "params")}
    if isinstance(obj, list):
        return [_downgrade_to_v1(v) for v in obj]
    return obj


def test_state_replaced_between_calls_keeps_its_name(tmp_path):
    """The module stack learns each module's state names once (xray/record/modules.py); a
    parameter replaced, a state dict replaced, or a parameter added later is still named."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with torch.no_grad(), xray.dump(dump_dir=tmp_path, X_DEDUP=False, X_DUMP_NUM=0) as d:
        lin(x)
        lin.weight = torch.nn.Parameter(torch.randn(4, 4))  # a new object under the same name
        lin(x)
        lin._parameters = dict(lin._parameters)  # a new dict holding the same names
        lin.weight = torch.nn.Parameter(torch.randn(4, 4))
        lin(x)
        lin.register_buffer("scale", torch.full((4,), 2.0))  # state registered after the first call
        lin.forward = lambda inp: torch.nn.functional.linear(inp, lin.weight, lin.bias) * lin.scale
        lin(x)
    dump = xray.load_dump(d.folder)
    weights = [m.source for r in dump.records if r.op == "aten.t.default" for _, m in r.input_tensors()]
    assert weights == ["param:weight"] * 4, weights
    scales = [m.source for r in dump.records if r.op == "aten.mul.Tensor" for _, m in r.input_tensors()]
    assert "buffer:scale" in scales, scales


def test_version_1_dumps_and_journals_still_read(tmp_path):
    _, dump = record(lambda: torch.ones(2).exp(), tmp_path / "a")
    assert dump.header["format_version"] == 3
    assert dump.records[-1].inputs["self"].source.startswith("op:")
    rewrite_as_json(dump.folder)  # the JSON records of version 2, downgraded to version 1 below
    index = dump.folder / "dump.json"
    data = _downgrade_to_v1(json.loads(index.read_text()))
    data["format_version"] = 1
    index.write_text(json.dumps(data))
    old = xray.load_dump(dump.folder)
    assert len(old.records) == 2 and all(m.source is None for r in old.records for _, m in r.input_tensors())
    # the journal of a v1 dump that was never finished
    index.unlink()
    lines = [json.dumps({"header": {k: v for k, v in data.items() if k not in ("records", "summary", "complete")}})]
    lines += [json.dumps(r) for r in data["records"]]
    (dump.folder / "journal.jsonl").write_text("\n".join(lines) + "\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TruncatedDumpWarning)
        journal = xray.load_dump(dump.folder)
    assert [r.op for r in journal.records] == [r.op for r in old.records]
    assert journal.records[-1].inputs["self"].source is None


def test_journal_of_a_v3_dump_keeps_sources(tmp_path):
    """A dump that is never finished reads from its journal chunks with every data edge."""
    with xray.dump(dump_dir=tmp_path, X_DEDUP=False) as session:
        torch.ones(2).exp()
        session.writer.flush()
        header = (session.folder / "journal.jsonl").read_text()
        chunks = sorted(session.folder.glob("journal-*.h5"))
        copy = tmp_path / "copy"
        copy.mkdir()
        for f in [session.folder / "journal.jsonl", *chunks]:
            (copy / f.name).write_bytes(f.read_bytes())
    assert '"format_version": 3' in header and chunks
    with pytest.warns(TruncatedDumpWarning, match="not finalised"):
        partial = xray.load_dump(copy)
    assert [r.op for r in partial.records] == ["aten.ones.default", "aten.exp.default"]
    assert partial.records[1].inputs["self"].source == "op:0:0"


def test_dead_outputs_are_swept_so_the_map_follows_live_tensors():
    producers = Producers()
    keep = torch.randn(2)
    producers.produced(0, ("aten.randn.default",), keep)
    for seq in range(1, 20001):
        producers.produced(seq, ("aten.empty.memory_format",), torch.empty(1))  # dies at once
    assert len(producers._by_id) <= 8192
    assert producers.source_of(keep) == "op:0:0"


def test_buffers_updated_in_place_keep_their_names(tmp_path):
    """BatchNorm in training updates running statistics and num_batches_tracked in place: the
    next call still reads them as the module's buffers."""
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)).train()
    x = torch.randn(8, 4)
    _, dump = record(lambda: (net(x), net(x)), tmp_path, X_DEBUG=0x112)
    increments = [r for r in dump.records if r.op == "aten.add_.Tensor"]
    assert [r.inputs["self"].source for r in increments] == ["buffer:1.num_batches_tracked"] * 2
    norms = [r for r in dump.records if r.kind == "op" and "batch_norm" in r.op]
    assert len(norms) == 2
    for r in norms:
        assert r.inputs["running_mean"].source == "buffer:1.running_mean"
        assert r.inputs["weight"].source == "param:1.weight"
    bn = [r for r in dump.records if r.kind == "module" and r.op == "BatchNorm1d"]
    assert set(bn[0].params) == {"weight", "bias", "running_mean", "running_var", "num_batches_tracked"}
    assert bn[0].params["running_var"].source == "buffer:1.running_var"
    lin = [r for r in dump.records if r.kind == "module" and r.op == "Linear"]
    assert lin[0].params["bias"].source == "param:0.bias" and lin[0].inputs["input.0"].source == "input"


@pytest.mark.parametrize("native", ["1", "0"])
@pytest.mark.usefixtures("one_record_per_key")
def test_a_folded_call_keeps_its_record_and_its_first_arguments_producer(native, tmp_path, monkeypatch):
    """De-dup writes no record of a folded call; the folds table keeps the record it was folded
    into and where its first argument came from, so compare follows a data edge through a folded
    view to the call that made its values (the C path and the Python path alike)."""
    monkeypatch.setenv("XRAY_NATIVE_ROWS", native)
    x = torch.randn(4, 6)

    def fn():
        a = x.exp()
        a.t()
        b = a.exp()  # a record of its own: its argument comes from an exp, x from outside (roles)
        c = b.exp()  # folded into exp #1's record; its argument is exp #1's output
        return c.t()  # folded into t #0's record; its argument is the folded exp's output

    _, dump = record(fn, tmp_path, X_DEDUP=True, X_DUMP_NUM=0)
    ops = op_records(dump)
    exp0, t0, exp1 = sorted(ops)
    assert [ops[s].op for s in (exp0, t0, exp1)] == ["aten.exp.default", "aten.t.default", "aten.exp.default"]
    (s_exp, *exp_fold), (s_t, *t_fold) = dump.columns.folds.tolist()
    assert exp_fold == [exp1, exp1, 0]
    assert t_fold == [t0, s_exp, 0]
    assert dump.columns.fold_of(s_t) == (t0, s_exp, 0) and dump.columns.fold_of(t0) is None


@pytest.mark.usefixtures("one_record_per_key")
def test_hostile_fold_rows_are_left_out_and_the_dump_opens(tmp_path):
    """A fold row that cannot be true (a record that is not there, a producer that ran after the
    call, a negative seq) is left out and counted; the records open, and `xray info` says so.
    A folds table of another type is left out whole: it is optional, the records still open."""
    import h5py
    import numpy as np

    from xray.cli import info_text

    x = torch.randn(3)
    _, dump = record(lambda: [x.exp().exp() for _ in range(3)], tmp_path / "d", X_DEDUP=True, X_DUMP_NUM=0)
    good = dump.columns.folds.copy()
    assert len(good) == 4  # two records: exp of x, and exp of an exp's output (another role)
    folder = dump.folder
    index = folder / json.loads((folder / "dump.json").read_text())["index"]

    def rewrite(folds):
        with h5py.File(index, "r+") as f:
            del f["folds"]
            f.create_dataset("folds", data=folds)

    bad = good.copy()
    bad["record"][0] = 10 ** 12  # no such record
    bad["src_seq"][1] = bad["seq"][1] + 5  # produced after it ran
    bad["seq"][2] = -3
    rewrite(bad)
    reopened = xray.load_dump(folder)
    assert len(reopened.records) == len(dump.records)
    assert reopened.columns.folds.tolist() == good[3:].tolist() and reopened.columns.folds_refused == 3
    assert "3 fold rows refused at load" in info_text(reopened)

    rewrite(np.zeros(4, np.float32))
    reopened = xray.load_dump(folder)
    assert len(reopened.records) == len(dump.records) and len(reopened.columns.folds) == 0
    assert "folds table left out at load: column 'folds' is float32" in info_text(reopened)
