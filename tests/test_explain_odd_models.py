"""explain and fix on legal but odd models: one that writes to its input, one that is not
deterministic (dropout in train mode), one whose bench output is NaN; and command lines that
are refused before the factory builds anything."""
from __future__ import annotations

import pytest
import torch

from xray.cli import main
from xray.explain import analysis
from xray.explain.checks import NotDeterministic

FACTORY = """
import pathlib, torch
from torch import nn

class Mutating(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.out = nn.Linear(16, 16), nn.Linear(16, 16)
    def forward(self, x):
        x.mul_(2.0).add_(1.0)  # legal: in place on its own input
        return self.out(torch.relu(self.lin(x)))

class Dropped(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.drop, self.out = nn.Linear(16, 16), nn.Dropout(0.1), nn.Linear(16, 16)
    def forward(self, x):
        return self.out(self.drop(self.lin(x)))

class NaNs(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)
    def forward(self, x):
        return self.lin(x) * float("nan")

def mutating():
    torch.manual_seed(0)
    return Mutating().eval(), (torch.randn(4, 16),)

def dropout():
    torch.manual_seed(0)
    return Dropped().train(), (torch.randn(4, 16),)

def nan_bench():
    torch.manual_seed(0)
    return NaNs().eval(), (torch.randn(4, 16),)

def build():
    pathlib.Path(__file__).with_name("built").touch()  # the factory ran
    return mutating()
"""


@pytest.fixture
def factory(tmp_path):
    path = tmp_path / "odd.py"
    path.write_text(FACTORY)
    return path


def _load(factory, name):
    from xray.drift.load import load_model

    return load_model(f"{factory}:{name}")


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_a_model_that_writes_to_its_input_gets_fresh_inputs_every_run(factory):
    """Each run saw the previous run's x.mul_(2).add_(1): final error 1.04, called "bf16 noise"."""
    model, args, _ = _load(factory, "mutating")
    given = args[0].clone()
    x = analysis.explain(model, args, target="cpu:bf16", op_modules=0, residual=False)
    fresh_model, fresh_args, _ = _load(factory, "mutating")
    with torch.no_grad():
        bench = fresh_model(fresh_args[0].clone())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            target = fresh_model(fresh_args[0].clone())
    from xray.explain.trees import error

    assert x.error == error(target.float(), bench) < 0.02  # bf16's own error on the factory's input
    assert torch.equal(args[0], given)  # the caller's tensor is untouched


def test_dropout_in_train_mode_is_refused_not_blamed(factory, capsys):
    """Dropout was blamed for 111 % of the error (its random mask, not its precision)."""
    model, args, _ = _load(factory, "dropout")
    with pytest.raises(NotDeterministic, match=r"not deterministic \(drop \(Dropout\)\)"):
        analysis.explain(model, args, target="cpu:bf16", op_modules=0)
    for cmd in (["explain"], ["fix", "--max-error", "1e-2"]):
        rc = main([*cmd, f"{factory}:dropout", "--target", "cpu:bf16", "--out", str(factory.parent / "out")])
        err = _one_line(capsys)
        assert rc == 2 and "cannot tell: the model is not deterministic (drop (Dropout))" in err


def test_a_nan_bench_is_refused(factory, capsys):
    """An all-NaN bench read as "the target gives the bench's output exactly: nothing to explain", exit 0."""
    rc = main(["explain", f"{factory}:nan_bench", "--target", "cpu:bf16", "--out", str(factory.parent / "out")])
    err = _one_line(capsys)
    assert rc == 2 and "the bench (cpu) itself is non-finite: 64 of 64" in err
    assert not (factory.parent / "out" / "explain.json").exists()


@pytest.mark.parametrize("argv, message", [
    (["--target", "cpu:int3"], "unknown precision mode"),
    (["--target", "cpu:bf16", "--bench", "cpu:nope"], "unknown precision mode"),
    (["--target", "cpu:bf16", "--inject", "mm"], "--inject"),
    (["--target", "cpu:bf16", "--op-modules", "-1"], "--op-modules -1"),
    (["--target", "cpu:bf16", "--top", "-3"], "--top -3"),
    (["--target", "cpu:bf16", "--threads", "-2"], "--threads -2"),
])
def test_bad_arguments_are_refused_before_the_factory_runs(factory, capsys, argv, message):
    """A bad SPEC or --inject was found only after the factory had built the model."""
    rc = main(["explain", f"{factory}:build", *argv, "--out", str(factory.parent / "out")])
    assert rc == 2 and message in _one_line(capsys)
    assert not factory.with_name("built").exists()
