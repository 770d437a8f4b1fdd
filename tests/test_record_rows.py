"""The recorder's row paths (xray/record/rows.py, and its common call in C, _fastpath.c) write
the same index as the Record path.

Every scenario is recorded three times in one process, from the same starting state: with
``XRAY_ROW_PATH=0`` (every call through a ``Record``), with the Python row path
(``XRAY_NATIVE_ROWS=0``) and with the C path where it is built. The dumps must hold equal
records, field for field: statistics are the same floats (the C path's one-pass formula is
stats.py's, operation for operation).
"""
from __future__ import annotations

import json
import re

import pytest
import torch

import xray
from xray.record import rows as rows_mod

NATIVE = rows_mod._fastpath is not None
# path -> (XRAY_ROW_PATH, XRAY_NATIVE_ROWS)
PATHS = {"record": ("0", "1"), "python rows": ("1", "0"), "native rows": ("1", "1")}

CONFIGS = {
    "meta+stats, no dedup": dict(X_DEBUG=0x102, X_DEDUP=False, X_DUMP_NUM=0),
    "meta+stats, dedup": dict(X_DEBUG=0x102, X_DEDUP=True, X_DUMP_NUM=0),
    "stats only": dict(X_DEBUG=0x002, X_DEDUP=False, X_DUMP_NUM=0),
    "meta only": dict(X_DEBUG=0x100, X_DEDUP=False, X_DUMP_NUM=0),
    "backward + modules": dict(X_DEBUG=0x11a, X_DEDUP=False, X_DUMP_NUM=0),
    # what the row path took from the Record path: saved tensors, Python stacks, bare records
    "saved tensors": dict(X_DEBUG=0x102, X_DEDUP=False, X_DUMP_NUM=2),
    # begin_dump()'s defaults: the C path takes the calls de-dup folds, Python the new records
    "the defaults": dict(X_DEBUG=0x102, X_DEDUP=True, X_DUMP_NUM=5),
    "stacks + dedup": dict(X_DEBUG=0x106, X_DEDUP=True, X_DUMP_NUM=0),
    "neither meta nor stats": dict(X_DEBUG=0x008, X_DEDUP=False, X_DUMP_NUM=0),
}


def use_path(monkeypatch, path: str) -> None:
    row_path, native = PATHS[path]
    monkeypatch.setenv("XRAY_ROW_PATH", row_path)
    monkeypatch.setenv("XRAY_NATIVE_ROWS", native)


def check_path(recorder, path: str, **kw) -> None:
    """The recorder took the path it was asked for (the C path needs META and STATS)."""
    assert (recorder.rows is not None) == (path != "record")
    debug = kw.get("X_DEBUG", 0x102)
    # the C path: META and STATS, no Python stacks, and no saved tensors unless de-dup folds calls
    common = (debug & 0x106) == 0x102 and (not kw.get("X_DUMP_NUM", 0) or kw.get("X_DEDUP", False))
    assert (recorder.native is not None) == (path == "native rows" and NATIVE and common)


def all_paths(fn, tmp_path, monkeypatch, reset=lambda: None, **kw):
    """The records of ``fn`` on each path, the Record path's first."""
    dumps = []
    for i, path in enumerate(PATHS):
        use_path(monkeypatch, path)
        reset()
        with xray.dump(dump_dir=tmp_path / f"path{i}", flush_records=37, **kw) as session:
            fn()
        assert session.recorder.failed is None
        check_path(session.recorder, path, **kw)
        dump = xray.load_dump(tmp_path / f"path{i}")
        # the folded calls' data edges too (de-dup): every path names the same producers
        dumps.append([_same_file(r.to_json()) for r in dump.records] + [{"folds": dump.columns.folds.tolist()}])
        for r in dump.records:  # every saved tensor reads back as the values described
            for _, meta in [*r.input_tensors(), *r.output_tensors()]:
                if meta.data is not None:
                    assert dump.load_tensor(meta).shape == tuple(meta.shape)
    return dumps


def _without_checks(record: dict) -> dict:
    return {**record, "outputs": [{k: v for k, v in t.items() if k != "check"} if isinstance(t, dict) else t
                                  for t in record.get("outputs", ())]} if "outputs" in record else record


def _same_file(record: dict) -> dict:
    """A record's fields with its data references' segment names dropped (each dump has its own)."""
    return json.loads(re.sub(r'"tensors-[0-9a-f-]+\.h5:', '"', json.dumps(record)))


def assert_same(dumps, at_least: int) -> None:
    plain, *rows = dumps
    assert len(plain) > at_least
    for path, got in zip(list(PATHS)[1:], rows):
        assert got == plain, path


def odd_ops():
    """Calls the row path must key and describe exactly as the Record path: in-place writes,
    views, Tensor[] results, non-finite and integer scalars, dtype and device arguments, NaN
    and Inf values, empty, integer, bool, bfloat16 and strided inputs, meta and sparse tensors."""
    x = torch.linspace(-2, 2, 24).reshape(4, 6)
    y = x.t().contiguous()
    x.mul_(1.5).add_(0.25)  # in place: the statistics of x before and after differ
    parts = torch.split(x, [2, 4], dim=1)
    torch.cat([parts[1], parts[0]], dim=1).sum(dim=0, keepdim=True)
    torch.stack(list(torch.unbind(y[:2], dim=0)))
    z = x.clone()
    z[0, 0] = float("nan")
    z[1, 1] = float("inf")
    (z * float("inf")).nan_to_num(nan=0.0, posinf=1e4, neginf=-1e4)
    torch.clamp(z, min=-1.0, max=float("inf"))
    x.to(torch.bfloat16).float().sum()
    torch.arange(10, dtype=torch.int64).reshape(2, 5).sum(dim=1)
    (x > 0).any()
    torch.empty(0, 3).sum(dim=0)
    torch.where(x > 0, x, torch.zeros_like(x)).max(dim=1)
    x[:, ::2].exp()
    torch.zeros(2, 3, device="meta").add(1)
    torch.eye(3).to_sparse().coalesce()
    torch.full((3,), 7, dtype=torch.int32).cumsum(0)
    torch.nn.functional.softmax(x, dim=-1, dtype=torch.float64)


@pytest.mark.parametrize("config", CONFIGS)
def test_odd_ops_give_the_same_records(config, tmp_path, monkeypatch):
    assert_same(all_paths(odd_ops, tmp_path, monkeypatch, **CONFIGS[config]), 30)


class _Roles(torch.nn.Module):
    """Calls whose de-dup key differs by their inputs' roles only (encode.dedup_key)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("scale", torch.full((4,), 0.5))

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        s = torch.masked_fill(x, x > 1, torch.scalar_tensor(-1.0))  # fed by an input
        s = torch.masked_fill(s.exp(), s > 1, torch.scalar_tensor(0.0))  # the same signature, fed by exp
        w = self.lin.weight * self.scale  # a parameter, a buffer
        v = x * self.scale  # an input, a buffer: one signature with ``w``'s, another role
        c = torch.cat([h, s.tanh()], dim=0)  # a Tensor[] argument's items
        lo, hi = torch.aminmax(x, dim=0)  # two outputs of one call: two roles
        d = lo.exp() * hi.exp()
        return torch.add(v, w, alpha=2.0) + torch.where(c[:4] > 0, c[4:], other=h) + h + d


def roles_and_loops(net: torch.nn.Module) -> None:
    """One module's calls of one signature fed by different producers, a recurrence (its state is
    the last step's output), and a tensor whose storage was swapped (``.data``: an input again)."""
    x, h = torch.linspace(-2, 2, 16).reshape(4, 4), torch.zeros(4, 4)
    for _ in range(4):
        h = net(x, h).tanh()
    h.data = torch.linspace(-1, 1, 16).reshape(4, 4)
    net(x, h)


@pytest.mark.parametrize("config", ["meta+stats, dedup", "stacks + dedup", "the defaults"])
def test_dedup_roles_give_the_same_records(config, tmp_path, monkeypatch):
    torch.manual_seed(0)
    net = _Roles()
    assert_same(all_paths(lambda: roles_and_loops(net), tmp_path, monkeypatch, **CONFIGS[config]), 20)


def _statistics_cases() -> list[torch.Tensor]:
    """Tensors whose statistics take each branch of the one-pass formula and of its fallbacks:
    contiguous, strided, broadcast and 0-d; every native dtype and others; constants; a mean far
    above the spread (the exact two-pass formula); NaN and Inf (the slow path); empty; sizes
    around the vector kernels' tails."""
    g = torch.Generator().manual_seed(3)
    base = torch.randn(3, 5, 7, generator=g)
    cases = [base, base.transpose(0, 2), base[:, 1:4, ::2], base[..., 0], torch.randn(4, 1, generator=g).expand(4, 6),
             torch.tensor(2.5), torch.full((9,), 7.0), 1e4 + torch.rand(64, generator=g) * 1e-3,
             torch.tensor([1.0, float("nan"), 3.0]), torch.tensor([float("inf"), -1.0]), torch.zeros(0, 4)]
    cases += [torch.randn(n, generator=g) for n in (1, 7, 15, 16, 17, 31, 33, 255, 257, 1000)]
    cases += [base.double(), base.bfloat16(), base.half(), (base * 10).to(torch.int64), (base * 10).to(torch.int32),
              (base * 10).to(torch.int16), (base * 10).to(torch.int8), (base.abs() * 10).to(torch.uint8), base > 0]
    return cases


STATISTICS_CASES = _statistics_cases()


def statistics_cases():
    for t in STATISTICS_CASES + STATISTICS_CASES:  # the second time, every text is interned
        t.clone()  # recorded: its input and its result are described
        t.reshape(-1)  # a view, or a copy of a strided tensor
        t.double()  # new values (a float64 tensor: itself)
    torch.tensor([1.0, 2.0]).mul(3)  # lift_fresh returns its input: a result the recorder knows


@pytest.mark.parametrize("config", ["meta+stats, no dedup", "meta+stats, dedup"])
def test_statistics_cases_give_the_same_records(config, tmp_path, monkeypatch):
    assert_same(all_paths(statistics_cases, tmp_path, monkeypatch, **CONFIGS[config]), 20)


def test_an_op_that_raises_gives_the_same_records(tmp_path, monkeypatch):
    """The op's own error reaches the caller unchanged on every path, and recording goes on."""
    def fn():
        x = torch.ones(2, 3)
        x.sum()
        with pytest.raises(RuntimeError, match="size of tensor a"):
            x + torch.ones(4)
        (x * 2).sum()

    assert_same(all_paths(fn, tmp_path, monkeypatch, **CONFIGS["meta+stats, no dedup"]), 2)


@pytest.mark.slow
@pytest.mark.parametrize("config", ["meta+stats, no dedup", "meta+stats, dedup", "backward + modules",
                                    "the defaults"])
def test_llama_training_step_gives_the_same_records(config, llama, tokens, tmp_path, monkeypatch):
    def step():
        out = llama(tokens)
        out.logits.float().pow(2).mean().backward()

    assert_same(all_paths(step, tmp_path, monkeypatch, reset=lambda: llama.zero_grad(set_to_none=True),
                          **CONFIGS[config]), 60)


@pytest.mark.slow
@pytest.mark.parametrize("config", ["meta+stats, no dedup", "meta+stats, dedup", "the defaults"])
def test_llama_inference_gives_the_same_records(config, llama, tokens, tmp_path, monkeypatch):
    """Repeated forwards under no_grad and inference_mode: what the C path takes nearly alone."""
    def forwards():
        with torch.no_grad():
            llama(tokens)
            llama(tokens)
        with torch.inference_mode():
            llama(tokens)

    assert_same(all_paths(forwards, tmp_path, monkeypatch, **CONFIGS[config]), 60)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["gpt2", pytest.param("bert", marks=pytest.mark.slow), pytest.param("t5", marks=pytest.mark.slow), "vit"])
def test_other_architectures_give_the_same_records(arch, tmp_path, monkeypatch):
    """Forward and backward with module records, on the self-check's architectures (random
    weights from their configs): encoder-decoder, convolution and layer-norm models take other
    ops, argument kinds and result structures than a Llama."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    from gen_selfcheck import ARCHS

    model, args, kwargs = ARCHS[arch](0)

    def step():
        out = model(*args, **kwargs)
        first = out[0] if isinstance(out, tuple) else next(iter(out.values()))
        first.float().pow(2).mean().backward()

    assert_same(all_paths(step, tmp_path, monkeypatch, reset=lambda: model.zero_grad(set_to_none=True),
                          **CONFIGS["backward + modules"]), 100)


def test_deferred_statistics_fill_the_rows(tmp_path, monkeypatch):
    """XRAY_DEFERRED_STATS=1: statistics are Stats objects filled at flush, read into the rows
    after the writer's before_flush; both paths see the same values."""
    monkeypatch.setenv("XRAY_DEFERRED_STATS", "1")
    dumps = all_paths(odd_ops, tmp_path, monkeypatch, **CONFIGS["meta+stats, no dedup"])
    # the Record path (the tests' reference encoding) takes no self-check where statistics are
    # deferred (docs/format.md, "Self-checks"): the row paths' checks are compared to each other
    plain, *rows = dumps
    assert any("check" in t for r in rows[0][:-1] for t in r["outputs"] if isinstance(t, dict))
    assert rows[0] == rows[1]
    assert_same([plain] + [[_without_checks(r) for r in d] for d in rows], 30)
    rows = dumps[-1]
    assert any(t.get("stats", {}).get("std") for r in rows for t in r["outputs"] if isinstance(t, dict))


# -- inference tensors: no version counter, cached until the recorder sees a write ---------------
def _input_stats(dump, op: str) -> list[tuple[float, float]]:
    """(min, max) of the first input of every record of ``op``, in order."""
    out = []
    for r in dump.records:
        if r.op == op:
            meta = next(iter(r.inputs.values()))
            out.append((meta.stats.min, meta.stats.max))
    return out


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dedup", [False, True])
def test_inference_tensor_written_through_a_view_is_reduced_again(path, dedup, tmp_path, monkeypatch):
    """Inference tensors have no version counter; the recorder caches their statistics until it
    sees any write. A write through a view (the base itself is not an argument) and a write
    folded by de-dup (never described) must both end the cache."""
    use_path(monkeypatch, path)
    with torch.inference_mode():
        x = torch.arange(6.0).reshape(2, 3)
        with xray.dump(dump_dir=tmp_path, X_DEDUP=dedup, X_DUMP_NUM=0):
            x.sum()
            x[0].add_(10.0)
            x.mean()
            x[0].add_(10.0)  # under de-dup: select and add_ both fold into the first call's records
            x.amax()
    dump = xray.load_dump(tmp_path)
    assert _input_stats(dump, "aten.sum.default") == [(0.0, 5.0)]
    assert _input_stats(dump, "aten.mean.default") == [(3.0, 12.0)]
    assert _input_stats(dump, "aten.amax.default") == [(3.0, 22.0)]


def test_inference_tensor_written_while_paused_is_reduced_again(tmp_path):
    with torch.inference_mode():
        x = torch.arange(6.0).reshape(2, 3)
        with xray.dump(dump_dir=tmp_path, X_DEDUP=False, X_DUMP_NUM=0) as session:
            x.sum()
            session.pause()
            x.mul_(2.0)  # not seen by the recorder
            session.start()
            x.sum()
    assert _input_stats(xray.load_dump(tmp_path), "aten.sum.default") == [(0.0, 5.0), (0.0, 10.0)]


@pytest.mark.usefixtures("one_record_per_key")
def test_dedup_counts_survive_flushes_and_a_crash(tmp_path):
    """A folded call only bumps its record's count; each flush writes the counts that grew since
    the one before (journal updates), and the final index has them all."""
    import shutil

    from xray.dump import TruncatedDumpWarning

    with xray.dump(dump_dir=tmp_path / "d", X_DEDUP=True, X_DUMP_NUM=0, flush_records=1,
                   flush_seconds=0.0) as session:
        x = torch.ones(3)
        for _ in range(5):
            x * 2
        session.writer.flush()
        shutil.copytree(session.writer.folder, tmp_path / "killed")  # what a kill here leaves
        for _ in range(3):
            x * 2
        (x * 2).sum()

    def counts(folder):
        return {r.op: (r.count, r.last_seq) for r in xray.load_dump(folder).records}

    final = counts(session.writer.folder)
    assert final["aten.mul.Tensor"][0] == 9 and final["aten.sum.default"][0] == 1
    with pytest.warns(TruncatedDumpWarning):
        killed = counts(tmp_path / "killed")
    assert killed["aten.mul.Tensor"][0] == 5 and killed["aten.mul.Tensor"][1] < final["aten.mul.Tensor"][1]


class _Marked(torch.Tensor):
    """A tensor subclass without a dispatch of its own."""


def other_values():
    """Arguments the C path hands to Python, which the row path now takes itself: a tensor
    subclass, a complex scalar. (A Generator's text holds its wrapper's address, new per call.)"""
    x = torch.linspace(-1, 1, 12).reshape(3, 4)
    (x * (2 + 1j)).abs().sum()
    t = torch.linspace(0, 1, 6).reshape(2, 3).as_subclass(_Marked)
    (t * 3).sum()
    torch.tensor([1.0, 2.0]).pow(torch.tensor(2 + 0j)).real.exp()


@pytest.mark.parametrize("config", ["meta+stats, no dedup", "stats only", "saved tensors"])
def test_other_values_give_the_same_records(config, tmp_path, monkeypatch):
    assert_same(all_paths(other_values, tmp_path, monkeypatch, **CONFIGS[config]), 6)


@pytest.mark.usefixtures("one_record_per_key")
def test_folds_survive_flushes_and_a_crash(tmp_path):
    """Folded calls are kept in memory until a flush; a long run of them (no new record to flush
    them) flushes at ``folds_flush``, so a kill loses at most that many, and the chunks read back."""
    import shutil

    from xray.dump import TruncatedDumpWarning

    with xray.dump(dump_dir=tmp_path / "d", X_DEDUP=True, X_DUMP_NUM=0) as session:
        session.writer.folds_flush = 8  # two folded calls
        x = torch.ones(3)
        for _ in range(5):
            x * 2
        shutil.copytree(session.writer.folder, tmp_path / "killed")  # what a kill here leaves
        for _ in range(3):
            x * 2

    final = xray.load_dump(session.writer.folder).columns.folds
    assert len(final) == 7 and final["seq"].tolist() == sorted(final["seq"].tolist())
    with pytest.warns(TruncatedDumpWarning):
        killed = xray.load_dump(tmp_path / "killed").columns.folds
    assert killed.tolist() == final[:4].tolist()
