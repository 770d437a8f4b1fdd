"""De-dup keys a call by its inputs' roles (encode.dedup_key, Producers.roles).

Two calls of one signature in one module fed by different kinds of producers keep a record each:
CPM-Ant's ``masked_fill`` before its softmax and after it, GPT-NeoX's two parallel-residual adds.
Folded into one record, the second call's output was never compared, and what read it inherited
an error "from an unrecorded call". A role is a kind of producer (an op's name, a parameter, a
buffer, a model input), never a call, so a recurrence still folds from its second step on.
"""
from __future__ import annotations

import math
import sys
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch

import xray
from xray.compare import compare_dumps
from xray.numerics.rules import Rules

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from accuracy.faults import ReducedPrecisionMatmul  # noqa: E402


class MaskedAttention(torch.nn.Module):
    """CPM-Ant's attention: masked_fill(-inf) before the softmax module, masked_fill(0) after it,
    each with a 0-d tensor as its value, so both calls have one signature."""

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.softmax = torch.nn.Softmax(dim=-1)
        self.out = torch.nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        score = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d // self.heads)
        score = torch.masked_fill(score, mask, torch.scalar_tensor(float("-inf")))
        score = self.softmax(score)
        score = torch.masked_fill(score, mask, torch.scalar_tensor(0.0))
        return self.out(torch.matmul(score, v).transpose(1, 2).reshape(b, n, d))


class ParallelBlock(torch.nn.Module):
    """GPT-NeoX's parallel residual: ``mlp(x) + attn(x) + x``, two adds of one signature."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.attn = MaskedAttention(dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 2 * dim), torch.nn.GELU(), torch.nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.mlp(x) + self.attn(x, mask) + x


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(ParallelBlock() for _ in range(2))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, mask)
        return x


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(1))
    return x, (torch.arange(16)[None, :] > torch.arange(16)[:, None]).expand(2, 1, 16, 16)


def _calls(dump, op: str) -> dict[str, int]:
    """Records of ``op`` per module."""
    out: dict[str, int] = {}
    for r in dump.records:
        if r.op == op:
            out[r.module] = out.get(r.module, 0) + 1
    return out


@pytest.mark.parametrize("native", ["1", "0"])
@pytest.mark.usefixtures("one_record_per_key")
def test_calls_of_one_signature_fed_by_different_producers_keep_a_record_each(native, tmp_path, monkeypatch):
    """With the recorder's defaults (X_DEDUP=1; the C path with X_DUMP_NUM=0): each attention's
    two masked_fills and each block's two adds are two records, not one."""
    monkeypatch.setenv("XRAY_NATIVE_ROWS", native)
    torch.manual_seed(0)
    net, (x, mask) = Net(), _inputs()
    for name, kw in (("defaults", {}), ("c path", {"X_DUMP_NUM": 0})):
        with torch.no_grad(), xray.dump(dump_dir=tmp_path / name, **kw):
            net(x, mask)
            net(x, mask)  # a second forward folds whole
        dump = xray.load_dump(tmp_path / name)
        attentions = [f"layers.{i}.attn" for i in range(2)]
        assert _calls(dump, "aten.masked_fill.Tensor") == {a: 2 for a in attentions}, name
        assert _calls(dump, "aten.add.Tensor") == {f"layers.{i}": 2 for i in range(2)}, name
        assert all(r.count == 2 for r in dump.records if r.op == "aten.masked_fill.Tensor"), name


def test_a_tf32_pair_recorded_with_the_defaults_has_no_fail(tmp_path):
    """The same net on a TF32-like target (matmul operands rounded to 10 bits): no FAIL row, and
    each masked_fill after a softmax is compared on its own record."""
    torch.manual_seed(0)
    net, (x, mask) = Net(), _inputs()
    for side in ("bench", "target"):
        with ReducedPrecisionMatmul() if side == "target" else nullcontext(), torch.no_grad(), \
                xray.dump(dump_dir=tmp_path / side):
            net(x, mask)
    result = compare_dumps(tmp_path / "bench", tmp_path / "target", rules=Rules(tf32=True))
    assert result.summary.failed == 0 and result.summary.first_divergence is None
    after_softmax = [r for r in result.rows if r.bench_op == "aten.masked_fill.Tensor"]
    assert len(after_softmax) == 4 and all(r.status != "fail" for r in after_softmax)


@pytest.mark.usefixtures("one_record_per_key")
def test_outputs_of_one_call_have_a_role_each_and_a_tensor_lists_items_one(tmp_path):
    """An op's outputs mean different things (an attention backward's grad_k and grad_v), so each
    is a role of its own; the items of one Tensor[] output (unbind's slices) share theirs."""
    x = torch.randn(4, 6)
    with xray.dump(dump_dir=tmp_path, X_DUMP_NUM=0):
        lo, hi = torch.aminmax(x, dim=0)
        lo.exp(), hi.exp()
        for row in x.unbind(0):
            row.exp()
    exps = [r for r in xray.load_dump(tmp_path).records if r.op == "aten.exp.default"]
    assert [r.count for r in exps] == [1, 1, 4]


class Cell(torch.nn.Module):
    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.ih, self.hh = torch.nn.Linear(dim, dim), torch.nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.ih(x) + self.hh(h))


@pytest.mark.parametrize("native", ["1", "0"])
def test_a_recurrence_still_folds(native, tmp_path, monkeypatch):
    """Step t's state comes from step t-1's tanh, a call whose record differs every step; the
    role is the op's name, so from the second step on every call folds: the records stop growing."""
    monkeypatch.setenv("XRAY_NATIVE_ROWS", native)
    torch.manual_seed(0)
    cell = Cell()
    records = {}
    for steps in (3, 12):
        xs = torch.randn(steps, 2, 8)
        with torch.no_grad(), xray.dump(dump_dir=tmp_path / str(steps), X_DUMP_NUM=0):
            h = torch.zeros(2, 8)
            for x in xs.unbind(0):  # (xs[t] would be a record per step: select's index differs)
                h = cell(x, h)
        dump = xray.load_dump(tmp_path / str(steps))
        records[steps] = len(dump.records)
        assert sum(r.count for r in dump.records if r.op == "aten.tanh.default") == steps
    assert records[3] == records[12]


@pytest.mark.slow
def test_cpmant_tf32_with_the_defaults_has_no_fail(tmp_path):
    """The architecture sweep's case: CPM-Ant (tiny, random weights), fp32 against emulated TF32,
    recorded with the defaults. Folded into one record, the post-softmax masked_fill left 8 FAIL
    rows (an error "from an unrecorded call"); with every call recorded, none."""
    from accuracy import zoo
    from accuracy.runner import run_scenario
    from accuracy.scenario import Scenario
    from accuracy.scenarios import RECORDER_DEFAULTS

    entry = next((e for e in zoo.listed() if e.model_type == "cpmant"), None)
    if entry is None:
        pytest.skip("this transformers has no CPM-Ant")
    arch = zoo.register(entry)
    o = run_scenario(Scenario(f"{arch}/tf32", "tf32", arch, noise="tf32", **RECORDER_DEFAULTS), tmp_path)
    assert o.crash is None and o.harness_error is None, (o.crash, o.harness_error)
    assert o.summary["failed"] == 0 and o.summary["first_divergence"] is None, o.summary["first_divergence"]
