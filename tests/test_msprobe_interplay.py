"""An msprobe module dump against xray's own (PrecisionDebugger) of the same model: they pair
module for module, and dumps taken at other steps pair with --ignore-step.

The msprobe side is written here as msprobe writes it (tests/test_msprobe.py runs the real
package, tens of seconds a run): ``step<N>/proc<pid>/dump.json`` with one entry per module call,
``Module.<path>.<Class>.forward.<n>``, added when the call ends (a decoder layer after the modules
inside it), and construct.json naming each call's enclosing call, in the order calls begin.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import xray
from xray.compare import CompareInputError, compare_dumps
from xray.compare.cli import main as compare_main

FILE = "globalrank-0_localrank-0.h5"


@pytest.fixture(autouse=True)
def _single_process(monkeypatch):
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)


class _Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj, self.o_proj = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

    def forward(self, x):
        return self.o_proj(torch.softmax(self.q_proj(x), -1))


class DecoderLayer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn, self.norm = _Attention(), torch.nn.LayerNorm(16)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))

    def forward(self, x):
        return x + self.mlp(self.norm(x + self.self_attn(x)))


class _Decoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(8, 16)
        self.layers = torch.nn.ModuleList([DecoderLayer(), DecoderLayer()])
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, x):
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.norm(h)


class _Model(torch.nn.Module):
    """Two identical decoder layers in a parent: where calls are ordered by their end, layer 0's
    record lands among layer 1's kind and gets paired with it."""

    def __init__(self):
        super().__init__()
        self.model, self.head = _Decoder(), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.model(x))


def _model():
    torch.manual_seed(0)
    return _Model().eval(), torch.randn(2, 5, 8)


def _stats(t: torch.Tensor) -> dict:
    t = t.detach()
    return {"type": "torch.Tensor", "dtype": str(t.dtype), "shape": list(t.shape), "Max": float(t.max()),
            "Min": float(t.min()), "Mean": float(t.float().mean()), "Norm": float(t.float().norm()),
            "requires_grad": t.requires_grad}


def msprobe_dump(folder: Path, model: torch.nn.Module, x: torch.Tensor, step: int = 0) -> Path:
    """msprobe's statistics L0 dump of one forward (no root module, as msprobe names none)."""
    data, construct, stack, calls = {}, {}, [], {}
    hooks = []
    for path, mod in model.named_modules():
        if not path:
            continue

        def pre(mod, args, path=path):
            n = calls.get(path, 0)
            calls[path] = n + 1
            key = f"Module.{path}.{type(mod).__name__}.forward.{n}"
            construct[key] = stack[-1] if stack else None
            stack.append(key)

        def post(mod, args, out, path=path):
            key = stack.pop()
            data[key] = {"input_args": [_stats(a) for a in args if isinstance(a, torch.Tensor)], "input_kwargs": {},
                         "output": [_stats(out)], "parameters": {n: _stats(p) for n, p in
                                                                 mod.named_parameters(recurse=False)}}

        hooks += [mod.register_forward_pre_hook(pre), mod.register_forward_hook(post)]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    proc = folder / f"step{step}" / "proc1234"
    proc.mkdir(parents=True)
    (proc / "dump.json").write_text(json.dumps({"task": "statistics", "level": "L0", "framework": "pytorch",
                                                "dump_data_dir": None, "data": data}))
    (proc / "construct.json").write_text(json.dumps(construct))
    (proc / "stack.json").write_text("{}")
    return folder / f"step{step}"


def xray_dump(folder: Path, model: torch.nn.Module, x: torch.Tensor, step: int = 0) -> Path:
    """PrecisionDebugger's module dump of the forward at ``step`` (earlier steps run unrecorded)."""
    dbg = xray.PrecisionDebugger(dump_path=folder, model=model, task="statistics", step=[step])
    with torch.no_grad():
        for _ in range(step + 1):
            dbg.start()
            model(x)
            dbg.stop()
            dbg.step()
    dbg.close()
    return folder / FILE


def test_msprobe_calls_read_in_the_order_they_begin(tmp_path):
    """As xray's records are: a module before the modules it calls."""
    m, x = _model()
    with xray.load_dump(msprobe_dump(tmp_path, m, x)) as d:
        order = [r.module for r in d.records]
    assert order[:4] == ["model", "model.embed", "model.layers.0", "model.layers.0.self_attn"]
    assert order.index("model.layers.0") < order.index("model.layers.0.mlp.0") < order.index("model.layers.1")


def test_an_msprobe_dump_pairs_module_for_module_with_an_xray_dump(tmp_path):
    """The same fp32 forward, dumped by each tool: layer 0's DecoderLayer was paired with layer 1's
    (a false FAIL) and every parent module was left unmatched."""
    m, x = _model()
    result = compare_dumps(msprobe_dump(tmp_path / "msprobe", m, x), xray_dump(tmp_path / "xray", m, x))
    s = result.summary
    assert s.failed == 0 and s.first_divergence is None, s.first_divergence
    pairs = [(r.bench_name, r.target_name) for r in result.rows if r.status != "unmatched"]
    assert len(pairs) == s.bench_records == 22 and all(b == t for b, t in pairs), pairs
    assert [r.target_name for r in result.rows if r.status == "unmatched"] == ["<root>._Model.0.forward"]


def test_dumps_at_other_steps_say_why_and_pair_with_ignore_step(tmp_path, capsys):
    """msprobe's step3 against xray's step 0: nothing matched, and the message only asked whether
    these were two runs of the same model."""
    m, x = _model()
    bench, target = msprobe_dump(tmp_path / "msprobe", m, x, step=3), xray_dump(tmp_path / "xray", m, x)
    with pytest.raises(CompareInputError, match="bench is step 3, target step 0: .*pass --ignore-step"):
        compare_dumps(bench, target)
    result = compare_dumps(bench, target, ignore_step=True)
    assert result.summary.matched == 22 and result.summary.failed == 0
    assert compare_main([str(bench), str(target), str(tmp_path / "out.csv"), "--ignore-step", "--no-progress"]) == 0
    assert compare_main([str(bench), str(target), str(tmp_path / "out.csv"), "--no-progress"]) == 2
    assert "pass --ignore-step" in capsys.readouterr().err


def test_ignore_step_pairs_steps_in_order(tmp_path):
    """Two xray dumps of two steps each, numbered 0-1 and 2-3: step 2 pairs with 0, 3 with 1."""
    m, x = _model()
    runs = []
    for name, first in (("a", 0), ("b", 2)):
        dbg = xray.PrecisionDebugger(dump_path=tmp_path / name, model=m, task="statistics", step=[first, first + 1])
        with torch.no_grad():
            for step in range(first + 2):
                dbg.start()
                m(x * (1 + step % 2))  # odd steps see other inputs: a step paired with the wrong one fails
                dbg.stop()
                dbg.step()
        dbg.close()
        runs.append(tmp_path / name / FILE)
    result = compare_dumps(*runs, ignore_step=True)
    assert result.summary.matched == 2 * 23 and result.summary.failed == 0
    partial = compare_dumps(runs[0], tmp_path / "a" / FILE)  # the same steps: no note
    assert not [w for w in partial.summary.warnings if "steps differ" in w]
