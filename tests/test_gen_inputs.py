"""xray.ops.rebuild: safe op resolution and deterministic input materialization (shared with replay)."""
from __future__ import annotations

import pytest
import torch

import xray
from xray.dump.model import Record, Stats, TensorMeta
from xray.ops.rebuild import MissingTensorError, UnknownOpError, build_call, materialize_value, resolve_op


def test_resolve_op():
    assert resolve_op("aten.add.Tensor") is torch.ops.aten.add.Tensor
    assert resolve_op("prims.add.default") is torch.ops.prims.add.default
    for bad in ("aten.add", "aten.add.Tensor;x", "aten.__dict__.x", "os.system.default", "aten.add.__call__", 3):
        with pytest.raises(UnknownOpError):
            resolve_op(bad)


def _rec(**inputs) -> Record:
    return Record(seq=7, kind="op", op="aten.add.Tensor", inputs=inputs)


def test_random_factory_follows_stats_and_seed():
    meta = TensorMeta(shape=(64, 32), dtype="bfloat16", stride=(1, 64), stats=Stats(-2.0, 3.0, 0.5, 1.0))
    ints = TensorMeta(shape=(100,), dtype="int64", stats=Stats(3.0, 9.0, 6.0, 1.0))
    rec = _rec(self=meta, other=ints, alpha=2)
    op, args, kwargs = build_call(rec, None, factory="random", seed=5)
    assert op is torch.ops.aten.add.Tensor and kwargs == {"alpha": 2}
    a, b = args
    assert a.dtype == torch.bfloat16 and a.stride() == (1, 64)  # recorded non-contiguous layout kept
    assert -2.0 <= float(a.min()) and float(a.max()) <= 3.0 and float(a.std()) > 0.5
    assert b.dtype == torch.int64 and int(b.min()) >= 3 and int(b.max()) <= 9 and len(b.unique()) > 3
    _, again, _ = build_call(rec, None, factory="random", seed=5)
    _, other, _ = build_call(rec, None, factory="random", seed=6)
    assert torch.equal(a, again[0]) and not torch.equal(a, other[0])


def test_bool_and_expanded_layout():
    mask = TensorMeta(shape=(4, 1000), dtype="bool", stride=(0, 1), stats=Stats(0.0, 1.0, 0.25, 0.4))
    t = materialize_value(mask, None, factory="random", generator=torch.Generator().manual_seed(0))
    assert t.stride() == (0, 1) and torch.equal(t[0], t[3])
    assert 0.15 < t.float().mean() < 0.35


def test_load_and_missing(tmp_path):
    x = torch.randn(3, 5)
    with xray.dump(dump_dir=tmp_path, X_DUMP_NUM=1) as d:
        torch.exp(x)
    dump = xray.load_dump(d.folder)
    rec = next(r for r in dump.records if r.op == "aten.exp.default")
    _, args, _ = build_call(rec, dump, factory="load")
    assert torch.equal(args[0], x)
    rec.inputs["self"].data = None
    with pytest.raises(MissingTensorError, match="--factory random"):
        build_call(rec, dump, factory="load")
    _, args, _ = build_call(rec, dump, factory="auto")  # falls back to the recorded range
    assert args[0].shape == x.shape and float(args[0].min()) >= float(x.min())


def test_scalars_are_validated():
    from xray.dump.model import Scalar

    assert materialize_value(Scalar("dtype", "float16"), None) is torch.float16
    assert materialize_value(Scalar("device", "cuda:0"), None, device="cpu") == torch.device("cpu")
    assert materialize_value(Scalar("memory_format", "channels_last"), None) is torch.channels_last
    for bad in (Scalar("dtype", "load"), Scalar("dtype", "__class__"), Scalar("layout", "float32"),
                Scalar("device", "cpu; rm"), Scalar("str", {"a": 1}), Scalar("complex", ["1", 2])):
        with pytest.raises(ValueError):
            materialize_value(bad, None)


def test_missing_templates_give_a_clear_error(monkeypatch, tmp_path):
    from xray.gen import generator

    monkeypatch.setattr(generator.xray, "__file__", str(tmp_path / "pkg" / "xray" / "__init__.py"))
    with pytest.raises(generator.GenerationError, match="templates not found"):
        generator.templates_dir()


@pytest.mark.slow
def test_random_class_targets_hold_ignore_index_or_valid_classes(tmp_path):
    """A class-index target with ignored samples is recorded over [-100, C-1]: drawn uniformly
    there, most negative values are invalid classes and nll_loss refuses them. Regenerated, the
    target holds ignore_index at about its recorded share and valid classes elsewhere, so the
    regenerated call runs, in replay and in a generated test alike."""
    from tests.test_gen import run_pytest
    from xray.gen.cli import main as gen_main

    classes, n = 2048, 2048  # real size: a vocabulary-wide loss over 4x512 tokens
    logits = torch.randn(n, classes, requires_grad=True)
    target = torch.randint(0, classes, (n,))
    target[torch.rand(n) < 0.25] = -100  # padding, as a causal LM's shifted labels hold
    with xray.dump(dump_dir=tmp_path / "d", X_DEBUG=0x10A, X_DUMP_NUM=0) as d:  # with backward
        torch.nn.functional.cross_entropy(logits, target).backward()
    dump = xray.load_dump(d.folder)
    ops = {r.op: r for r in dump.records if r.kind == "op"}
    for name in ("aten.nll_loss_forward.default", "aten.nll_loss_backward.default"):
        func, args, kwargs = build_call(ops[name], dump, factory="random", seed=3)
        names = [a.name for a in func._schema.arguments]
        drawn = args[names.index("target")]
        assert int(drawn.min()) == -100 and int(drawn.max()) <= classes - 1
        assert not ((drawn < 0) & (drawn != -100)).any()
        share = float((drawn == -100).double().mean())
        assert abs(share - float((target == -100).double().mean())) < 0.05, share
        func(*args, **kwargs)  # runs: every class is valid
    folder = tmp_path / "suite"
    assert gen_main([str(d.folder), "-o", str(folder), "-q", "--factory", "random"]) == 0
    assert "ignore=-100" in "".join(f.read_text() for f in folder.glob("test_*nll_loss*.py"))
    res = run_pytest(folder)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
