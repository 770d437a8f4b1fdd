"""Module replay: recorded nn.Module calls from a PrecisionDebugger dump, on ONNX Runtime.

The factory rebuilds the model; recorded parameters are loaded into each replayed module, so the
replay matches the recording even though the factory below uses a different seed.
"""
from __future__ import annotations

import pandas as pd
import pytest
import torch

import xray
from xray.backends.base import ReplayStatus
from xray.demo.models import tiny_llama, token_batch
from xray.replay.cli import main as replay_main
from xray.replay.modules import ModelSpecError, factory_spec
from xray.replay.runner import ReplayConfig, replay_dump


def small_llama() -> torch.nn.Module:
    return tiny_llama(layers=1, hidden=32, seed=123)  # other weights than the recorded run's


@pytest.mark.slow
def test_module_replay_from_precision_debugger(tmp_path):
    model = tiny_llama(layers=1, hidden=32)
    dbg = xray.PrecisionDebugger(tmp_path / "dump", model=model, backward=False)
    with torch.no_grad():
        dbg.start()
        model(token_batch())
        dbg.stop()
    cfg = ReplayConfig(backends=["onnxrt-cpu"], out=tmp_path / "out", model=factory_spec(small_llama),
                       modules=["*q_proj", "*input_layernorm", "*mlp", "*act_fn", "*self_attn", "*layers.0"],
                       repeats=1, progress=False)
    result = replay_dump(dbg.file, cfg)
    got = {(r.module, r.backend): ReplayStatus(r.status) for r in result.rows}
    # The attention and the decoder layer take keyword tensors (hidden_states, attention_mask,
    # position_embeddings as a (cos, sin) pair): the dump's keyword column gives them back by name.
    assert {m for m, _ in got} == {"model.layers.0.self_attn.q_proj", "model.layers.0.input_layernorm",
                                   "model.layers.0.mlp", "model.layers.0.mlp.act_fn", "model.layers.0.self_attn",
                                   "model.layers.0"}
    assert all(s == ReplayStatus.OK for s in got.values()), [(r.module, r.backend, r.error) for r in result.rows]
    # The baseline ran the recorded weights: its outputs equal the recorded outputs.
    dump, replayed = xray.load_dump(dbg.file), xray.load_dump(result.dumps["torch-cpu"])
    src = {(r.module, r.seq): r for r in dump.records if r.kind == "module"}
    for rec in replayed.records:
        want = src[(rec.module, rec.seq)]
        for (_, w), (_, g) in zip(want.output_tensors(), rec.output_tensors()):
            torch.testing.assert_close(replayed.load_tensor(g), dump.load_tensor(w), rtol=1e-6, atol=1e-6)
    assert len(pd.read_csv(result.out / "matrix.csv")) == 12


def test_bad_model_spec(tmp_path, capsys):
    with pytest.raises(ModelSpecError, match="pkg.module:factory"):
        factory_spec("not a spec")
    rc = replay_main([str(tmp_path), "-b", "onnxrt-cpu", "--model", "os.path"])
    assert rc == 2 and "pkg.module:factory" in capsys.readouterr().err


class _Classifier(torch.nn.Module):
    """A head and its loss, as a training script holds them: the loss is a module of its own."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.head = torch.nn.Linear(16, 10)
        self.loss = torch.nn.CrossEntropyLoss(ignore_index=-100)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self.loss(self.head(x), target)


def classifier() -> torch.nn.Module:
    return _Classifier()


@pytest.mark.slow
def test_module_replay_from_statistics_keeps_ignored_targets_valid(tmp_path):
    """A statistics-only dump of a loss module whose target ignores some samples (-100): the
    target's recorded range is [-100, 9]. Drawn uniformly in it, it held classes like -37 that
    cross_entropy refuses ("Target -37 is out of bounds"), so the replay errored. The module's
    ignore_index now stands at the share that keeps the recorded mean, valid classes elsewhere."""
    model = classifier()
    target = torch.randint(0, 10, (64,), generator=torch.Generator().manual_seed(0))
    target[::3] = -100
    dbg = xray.PrecisionDebugger(tmp_path / "dump", model=model, task="statistics", backward=False)
    with torch.no_grad():
        dbg.start()
        model(torch.randn(64, 16), target)
        dbg.stop()
    cfg = ReplayConfig(backends=["onnxrt-cpu"], out=tmp_path / "out", model=factory_spec(classifier),
                       modules=["loss"], factory="random", repeats=1, progress=False)
    result = replay_dump(dbg.file, cfg)
    got = [(r.module, r.backend, ReplayStatus(r.status), r.error) for r in result.rows]
    assert got and all(s == ReplayStatus.OK for _, _, s, _ in got), got
