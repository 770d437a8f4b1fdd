"""Parameters changed behind their version counter are never reported with old statistics (issue 18, item 4).

``p.data.add_()`` (EMA updates, manual edits) writes through an alias with its own version
counter; ``p.data = t`` (FSDP/ZeRO-style swaps) replaces the storage. Neither moves
``p._version``, so a statistics cache keyed on it alone reports step 0's weights forever.
"""
from __future__ import annotations

import pytest
import torch

import xray
from xray.dump.stats import StatsCache


def _mutations():
    return {
        "data_add_": lambda p: p.data.add_(100.0),
        "data_assign": lambda p: setattr(p, "data", p.data + 100.0),
        "no_grad_copy_into_data": lambda p: p.data.copy_(p.data + 100.0),
    }


@pytest.mark.parametrize("how", sorted(_mutations()))
def test_module_debugger_reports_the_changed_weight(tmp_path, how):
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 16)
    x = torch.randn(4, 16)
    dbg = xray.PrecisionDebugger(dump_path=tmp_path, model=lin, step=[0, 1], task="statistics")
    with torch.no_grad():
        for _ in range(2):
            dbg.start()
            lin(x)
            dbg.stop()
            dbg.step()
            _mutations()[how](lin.weight)
    dbg.close() if hasattr(dbg, "close") else None
    (h5,) = tmp_path.glob("*.h5")
    with xray.load_dump(h5) as dump:
        weights = {r.step: m for r in dump.records for n, m in
                   list(r.input_tensors()) + list(getattr(r, "params", {}).items()) if n.endswith("weight")}
        if not weights:  # module dumps name parameters "<...>.forward_params.weight"
            weights = {step: m for step in (0, 1) for n, m in dump.named_tensors(step) if n.endswith("params.weight")}
    assert weights[0].stats.max < 1.5 and weights[1].stats.min > 98.0, (weights[0].stats, weights[1].stats)


@pytest.mark.parametrize("how", sorted(_mutations()))
def test_tracer_reports_the_changed_weight_within_one_session(tmp_path, how):
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 16)
    x = torch.randn(4, 16)
    with torch.no_grad(), xray.dump(dump_dir=tmp_path, X_DEDUP=False) as d:
        lin(x)
        with torch.utils._python_dispatch._disable_current_modes():  # a change the tracer does not see
            _mutations()[how](lin.weight)
        lin(x)
    dump = xray.load_dump(d.folder)
    seen = [m.stats for r in dump.records if r.op == "aten.t.default" for _, m in r.input_tensors()]
    assert len(seen) == 2 and seen[0].max < 1.5 and seen[1].min > 98.0, seen


def test_cache_checks_the_data_pointer():
    cache = StatsCache()
    t = torch.zeros(8)
    assert cache.get(t).max == 0.0
    t.data = torch.ones(8)  # new storage, same object, same version
    assert cache.get(t).max == 1.0
