"""Isolation: an op that aborts the process is CRASH, one that hangs is TIMEOUT, and the run goes on;
an op the baseline cannot run is BASELINE_FAIL for the backends that ran it.

The two custom ops below behave normally while the dump is recorded; in the replay workers
(which import this module to register them) an environment variable makes ``boom`` call
``os.abort()`` and ``nap`` sleep far past the timeout.
"""
from __future__ import annotations

import os
import time

import pandas as pd
import pytest
import torch

import xray
from xray.backends.base import ReplayStatus
from xray.replay.cli import main as replay_main
from xray.replay.runner import ReplayConfig, replay_dump

ARMED = "XRAY_REPLAY_TEST_ARMED"


@torch.library.custom_op("xray_replay_test::boom", mutates_args=())
def boom(x: torch.Tensor) -> torch.Tensor:
    if os.environ.get(ARMED) == "1":
        os.abort()
    return x * 2


@boom.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("xray_replay_test::nap", mutates_args=())
def nap(x: torch.Tensor) -> torch.Tensor:
    if os.environ.get(ARMED) == "1":
        time.sleep(600)
    return x + 1


@nap.register_fake
def _(x):
    return torch.empty_like(x)


def _record(folder):
    x = torch.linspace(-1, 1, 12).reshape(3, 4)
    with xray.dump(X_DEDUP=True, X_DUMP_NUM=5, dump_dir=folder) as d:
        y = torch.exp(x)
        y = boom(y)
        y = torch.tanh(y)
        y = nap(y)
        torch.neg(y)
    return d.folder


@pytest.mark.slow  # waits out a real subprocess timeout (17 s)
def test_crash_and_timeout_are_isolated(tmp_path, monkeypatch):
    folder = _record(tmp_path / "dump")
    monkeypatch.setenv(ARMED, "1")  # inherited by the spawned workers
    cfg = ReplayConfig(backends=[], out=tmp_path / "out", timeout=8, repeats=1, progress=False,
                       imports=[__name__])
    result = replay_dump(folder, cfg)
    got = {r.op: ReplayStatus(r.status) for r in result.rows}
    assert got == {"aten.exp.default": ReplayStatus.OK, "xray_replay_test.boom.default": ReplayStatus.CRASH,
                   "aten.tanh.default": ReplayStatus.OK, "xray_replay_test.nap.default": ReplayStatus.TIMEOUT,
                   "aten.neg.default": ReplayStatus.OK}
    crash = next(r for r in result.rows if r.status == ReplayStatus.CRASH)
    assert "SIGABRT" in crash.error
    timeout = next(r for r in result.rows if r.status == ReplayStatus.TIMEOUT)
    assert "8 s" in timeout.error
    df = pd.read_csv(result.out / "matrix.csv")
    assert list(df.status) == ["OK", "CRASH", "OK", "TIMEOUT", "OK"]
    # The ops after the crash and the hang still made it into the replay dump.
    assert [r.op for r in xray.load_dump(result.dumps["torch-cpu"]).records] == [
        "aten.exp.default", "aten.tanh.default", "aten.neg.default"]


def test_unknown_backend_lists_presets(tmp_path, capsys):
    folder = _record(tmp_path / "dump")
    rc = replay_main([str(folder), "--backend", "tensorrt-gpu", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2
    assert "unknown backend 'tensorrt-gpu'" in err and "onnxrt-cpu" in err and "executorch-xnnpack" in err
    assert not (tmp_path / "out").exists()


def test_dump_without_tensors_or_statistics(tmp_path, capsys):
    x = torch.ones(3)
    with xray.dump(X_DEBUG=0x100, X_DUMP_NUM=0, dump_dir=tmp_path / "dump") as d:  # META only
        torch.exp(x)
    rc = replay_main([str(d.folder), "--backend", "onnxrt-cpu", "--out", str(tmp_path / "out"), "-q"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "no saved tensors and no statistics" in err and "aten.exp.default" in err


@pytest.mark.slow
def test_a_record_the_baseline_cannot_run_is_baseline_fail_never_within_tolerance(tmp_path):
    """ExecuTorch cannot lower a zero-size cat (a 0 stride), eager can: with ExecuTorch as the
    baseline, eager's row for that record ran but was compared with nothing. It must say so
    (BASELINE_FAIL: supported, not within tolerance), not pass as OK; the heatmap draws it."""
    from xray.replay.matrix import summary_table

    with torch.no_grad(), xray.dump(X_DEDUP=True, X_DUMP_NUM=5, dump_dir=tmp_path / "dump") as d:
        x = torch.arange(12.0).reshape(1, 3, 4)
        torch.cat([torch.empty(1, 0, 4), x], dim=1)
        torch.sin(x)
    cfg = ReplayConfig(backends=["torch-cpu"], baseline="executorch-portable", out=tmp_path / "out", progress=False,
                       timeout=180)
    result = replay_dump(d.folder, cfg)
    by_op = {(r.op, r.backend): r for r in result.rows}
    assert ReplayStatus(by_op["aten.cat.default", "executorch-portable"].status) == ReplayStatus.LOWER_FAIL
    cat = by_op["aten.cat.default", "torch-cpu"]
    assert ReplayStatus(cat.status) == ReplayStatus.BASELINE_FAIL and ReplayStatus(cat.status).supported
    assert cat.max_abs_err is None and "not compared" in cat.error
    assert ReplayStatus(by_op["aten.sin.default", "torch-cpu"].status) == ReplayStatus.OK
    table = summary_table(result)
    assert "BASELINE_FAIL=1" in table
    assert (tmp_path / "out" / "heatmap.png").stat().st_size > 0 and "BASELINE_FAIL" in (tmp_path / "out" / "heatmap.html").read_text()
