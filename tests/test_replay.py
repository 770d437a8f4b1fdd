"""xray-replay on a real transformers model: ONNX Runtime and ExecuTorch-XNNPACK against eager.

One replay of a representative subset of a 1-layer Llama's distinct ops (matmuls, softmax,
RMSNorm pieces, rotary, embedding, views) is shared by the tests below; each checks one output.
"""
from __future__ import annotations

import math
import os

import pandas as pd
import pytest
import torch

import xray
from xray.backends.base import ReplayStatus
from xray.demo.models import tiny_llama, token_batch
from xray.replay.matrix import MATRIX_COLUMNS
from xray.replay.runner import ReplayConfig, replay_dump, select_records

pytestmark = pytest.mark.slow  # a real model end to end, a deployment backend or the wheel (.ci/run)

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

# One of each kind of op the model runs: GEMMs, reductions, transcendental functions, data
# movement, integer ops. The first record of each matching signature is replayed.
OPS = ["aten.mm.default", "aten.bmm.default", "aten._softmax.default", "aten.rsqrt.default", "aten.silu.default",
       "aten.mean.dim", "aten.pow.Tensor_Scalar", "aten.cat.default", "aten.embedding.default", "aten.neg.default",
       "aten.where.self", "aten.transpose.int", "aten.cos.default", "aten.sin.default"]
BACKENDS = ["onnxrt-cpu", "executorch-xnnpack"]


@pytest.fixture(scope="module")
def llama_dump(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dump")
    model, ids = tiny_llama(layers=1, hidden=32), token_batch()
    with torch.no_grad(), xray.dump(X_DEDUP=True, X_DUMP_NUM=5, dump_dir=folder) as d:
        model(ids)
    return d.folder


@pytest.fixture(scope="module")
def replay(llama_dump, tmp_path_factory):
    out = tmp_path_factory.mktemp("replay")
    # One record per op name: the first signature of each is representative and keeps the test short.
    dump = xray.load_dump(llama_dump)
    ops_seen, seqs = set(), []
    for r in dump.records:
        if r.op in OPS and r.op not in ops_seen:
            ops_seen.add(r.op)
            seqs.append(r.seq)
    cfg = ReplayConfig(backends=BACKENDS, out=out, seqs=seqs, repeats=3, progress=False, timeout=180)
    result = replay_dump(llama_dump, cfg)
    return result, seqs


def _rows(result, backend, seqs):
    return [r for r in result.rows if r.backend == backend and r.seq in seqs]


def test_every_pair_has_a_status(replay):
    result, _ = replay
    assert result.records, "nothing was replayed"
    for rec in result.records:
        for b in ["torch-cpu", *BACKENDS]:
            assert isinstance(result.status(rec.seq, b), ReplayStatus)


def test_baseline_reproduces_the_recording(replay, llama_dump):
    """Eager replay of saved inputs must give back the recorded outputs bit for bit (same kernels)."""
    result, seqs = replay
    dump = xray.load_dump(llama_dump)
    replayed = xray.load_dump(result.dumps["torch-cpu"])
    by_seq = {r.seq: r for r in dump.records}
    checked = 0
    for rec in replayed.records:
        src = by_seq[rec.seq]
        for (_, want), (_, got) in zip(src.output_tensors(), rec.output_tensors()):
            if want.data and dump.has_data(want) and all(dump.has_data(m) for _, m in src.input_tensors()):
                torch.testing.assert_close(replayed.load_tensor(got), dump.load_tensor(want), rtol=0, atol=0)
                checked += 1
    assert checked >= 5


@pytest.mark.parametrize("backend", BACKENDS)
def test_most_ops_run_and_match(replay, backend):
    """Both backends cover these plain fp32 inference ops; we allow 2 of the 14 to fail or drift
    (XNNPACK or ORT may reject an odd signature such as a 0-size cat) and still call it "most"."""
    result, seqs = replay
    rows = [r for r in result.rows if r.backend == backend]
    ok = [r for r in rows if r.status == ReplayStatus.OK]
    bad = [(r.op, ReplayStatus(r.status).name, r.error) for r in rows if r.status != ReplayStatus.OK]
    assert len(ok) >= len(rows) - 2, bad
    for r in ok:
        assert r.max_abs_err is not None and math.isfinite(r.max_abs_err)
        assert r.latency_ms is not None and r.latency_ms > 0


def test_matrix_csv_and_facts(replay):
    result, _ = replay
    df = pd.read_csv(result.out / "matrix.csv")
    assert tuple(df.columns) == MATRIX_COLUMNS
    assert len(df) == len(result.rows) == len(result.records) * (1 + len(BACKENDS))
    assert set(df.status) <= {s.name for s in ReplayStatus}
    onnx = df[(df.backend == "onnxrt-cpu") & (df.status == "OK")]
    assert (onnx.opset >= 17).all()
    et = df[(df.backend == "executorch-xnnpack") & (df.status == "OK")]
    assert (et.pte_bytes > 0).all()
    assert (et.delegated_nodes + et.undelegated_nodes >= 1).all()
    assert et.delegated_nodes.sum() >= 1, "XNNPACK delegated nothing at all"
    assert (result.out / "heatmap.png").stat().st_size > 1000
    assert "<table>" in (result.out / "heatmap.html").read_text()


def test_replay_output_is_an_xray_dump(replay):
    result, _ = replay
    for backend in BACKENDS:
        d = xray.load_dump(result.dumps[backend])
        assert d.complete and d.header["replay"]["backend"] == backend
        ok = {r.seq for r in result.rows if r.backend == backend and ReplayStatus(r.status).supported}
        assert {r.seq for r in d.records} == ok
        for rec in d.records:
            for _, meta in rec.output_tensors():
                assert meta.stats is not None and d.has_data(meta)
                t = d.load_tensor(meta)
                assert tuple(t.shape) == meta.shape
                if t.is_floating_point() and t.numel():
                    assert math.isclose(float(t.min()), meta.stats.min, rel_tol=1e-6, abs_tol=1e-6)


@pytest.mark.skipif(not os.path.exists(os.path.join(os.path.dirname(xray.__file__), "compare", "cli.py")),
                    reason="xray-compare not available")
def test_xray_compare_reads_replay_output(replay, tmp_path, capsys):
    from xray.compare.cli import main as compare_main

    result, _ = replay
    csv = tmp_path / "cmp.csv"
    rc = compare_main([str(result.dumps["torch-cpu"]), str(result.dumps["onnxrt-cpu"]), str(csv), "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    df = pd.read_csv(csv)
    supported = sum(1 for r in result.rows if r.backend == "onnxrt-cpu" and ReplayStatus(r.status).supported)
    matched = df[df.status != "unmatched"]
    assert matched.target_seq.nunique() == supported
    # Both sides ran the same inputs; compare's own fp32 tolerance should pass nearly all of them.
    assert (matched.status == "pass").sum() >= 0.8 * len(matched), matched[["target_name", "status"]]


def test_export_cache_never_shares_baked_in_weights(tmp_path):
    """Two calls of one signature with different weights: exporters bake the weights into the
    artifact, so a cache keyed on the signature alone replayed the first call's weights."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8, bias=False), torch.nn.Linear(8, 8, bias=False))
    with xray.dump(X_DEDUP=False, X_DUMP_NUM=5, dump_dir=tmp_path / "dump") as d:
        model(torch.randn(4, 8))  # grad enabled: the weights are recorded as parameters
    dump = xray.load_dump(d.folder)
    seqs = [r.seq for r in dump.records if r.op == "aten.mm.default"]
    assert len(seqs) == 2
    cfg = ReplayConfig(backends=["onnxrt-cpu"], out=tmp_path / "out", seqs=seqs, dedup=False, repeats=0,
                       progress=False)
    result = replay_dump(d.folder, cfg)
    rows = [r for r in result.rows if r.backend == "onnxrt-cpu"]
    assert [ReplayStatus(r.status) for r in rows] == [ReplayStatus.OK, ReplayStatus.OK], [(r.seq, r.error) for r in rows]


def test_parent_vets_records_without_loading_tensors(tmp_path, monkeypatch):
    """The parent checks every record without reading tensor data (each worker loads its own
    inputs): a missing dataset is still skipped with the parent's message, and data that only
    fails when read is reported in the record's row."""
    import h5py

    from xray.dump.reader import TraceDump

    with xray.dump(X_DEDUP=False, X_DUMP_NUM=10, dump_dir=tmp_path / "dump") as d:
        x = torch.randn(3, 5)
        torch.exp(x), torch.neg(x + 1), torch.sin(x * 2)
    dump = xray.load_dump(d.folder)
    rec = {r.op: r for r in dump.records}
    exp, neg, sin = rec["aten.exp.default"], rec["aten.neg.default"], rec["aten.sin.default"]
    dump.close()

    def tamper(meta, unreadable: bool) -> None:
        fname, _, path = meta.data.partition(":")
        with h5py.File(d.folder / fname, "r+") as f:
            data, attrs = f[path][()], dict(f[path].attrs)
            del f[path]
            if unreadable:  # header intact, compressed bytes that fail to decompress when read
                ds = f.create_dataset(path, data=data, chunks=data.shape, compression="gzip")
                ds.attrs.update(attrs)
                chunk = ds.id.get_chunk_info(0)
                offset, size = chunk.byte_offset, chunk.size
        if unreadable:
            with open(d.folder / fname, "r+b") as raw:
                raw.seek(offset)
                raw.write(b"\xff" * size)

    tamper(exp.inputs["self"], unreadable=False)
    tamper(neg.inputs["self"], unreadable=True)
    loads = []
    real_load = TraceDump.load_tensor
    monkeypatch.setattr(TraceDump, "load_tensor", lambda self, meta: loads.append(meta) or real_load(self, meta))
    cfg = ReplayConfig(backends=[], out=tmp_path / "out", factory="load", dedup=False, repeats=0, progress=False,
                       seqs=[exp.seq, neg.seq, sin.seq])
    result = replay_dump(d.folder, cfg)

    assert loads == [], "the parent read tensor data"
    why = {r.seq: reason for r, reason in result.skipped}
    assert set(why) == {exp.seq, neg.seq}
    assert why[exp.seq].startswith(f"MissingTensorError: record seq={exp.seq} (aten.exp.default), argument 'self': "
                                   "tensor [3, 5] float32 was not saved") and "--factory random" in why[exp.seq]
    # compressed storage is refused from its header (xray writes none; a gzip chunk can be a bomb)
    assert "refused: filtered storage" in why[neg.seq], why[neg.seq]
    assert result.status(sin.seq, "torch-cpu") == ReplayStatus.OK


CUSTOM_OP_MODULE = '''
import torch

lib = torch.library.Library("xray_test_custom", "DEF")
lib.define("twice(Tensor x) -> Tensor")
lib.impl("twice", lambda x: x * 2, "CompositeExplicitAutograd")
'''


def test_import_makes_custom_ops_replayable(tmp_path, monkeypatch):
    """``--import MODULE`` is imported by the parent too, so a custom op is vetted and replayed
    instead of being skipped as unknown (issue 18, item 13)."""
    import subprocess
    import sys

    (tmp_path / "xray_custom_ops_mod.py").write_text(CUSTOM_OP_MODULE)
    script = ("import sys, torch, xray, xray_custom_ops_mod\n"
              "with xray.dump(X_DEDUP=False, X_DUMP_NUM=5, dump_dir=sys.argv[1]) as d:\n"
              "    torch.ops.xray_test_custom.twice(torch.randn(3, 4))\n"
              "print(d.folder)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    folder = subprocess.run([sys.executable, "-c", script, str(tmp_path / "dump")], env=env, cwd=tmp_path,
                            capture_output=True, text=True, check=True).stdout.strip()
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", env["PYTHONPATH"])  # the workers import it as well
    cfg = ReplayConfig(backends=[], out=tmp_path / "out", dedup=False, repeats=0, progress=False,
                       ops=["xray_test_custom.*"], imports=["xray_custom_ops_mod"])
    result = replay_dump(folder, cfg)
    assert not result.skipped, result.skipped
    (row,) = [r for r in result.rows if r.op == "xray_test_custom.twice.default"]
    assert row.status == ReplayStatus.OK, row
    with pytest.raises(ValueError, match="--import no_such_module_xray"):
        replay_dump(folder, ReplayConfig(backends=[], out=tmp_path / "o2", imports=["no_such_module_xray"]))


def test_constant_lifting_and_alias_no_ops_are_never_replayed(tmp_path):
    """aten.lift_fresh (a torch.tensor(...) inside the model), detach and alias return their
    input: they stay out of the replay and its support matrix, even when asked for by pattern."""
    x = torch.randn(3)
    with torch.no_grad(), xray.dump(dump_dir=tmp_path, X_DEDUP=False, X_DUMP_NUM=0) as d:
        y = (x * torch.tensor([1.0, 2.0, 3.0])).detach()
        torch.ops.aten.alias(y)
    records = xray.load_dump(d.folder).records
    assert {"aten.lift_fresh.default", "aten.detach.default", "aten.alias.default"} <= {r.op for r in records}
    for ops in ([], ["aten.*"]):
        picked = select_records(records, ReplayConfig(backends=[], out=tmp_path / "out", ops=ops))
        assert [r.op for r in picked] == ["aten.mul.Tensor"]
