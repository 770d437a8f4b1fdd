"""The CoreML path: conversion to an mlprogram is reported per op; prediction needs macOS.

On Linux every op that converts is UNSUPPORTED_PLATFORM (with the conversion's facts) and every
op that does not is EXPORT_FAIL with coremltools' message; nothing is silently OK.
"""
from __future__ import annotations

import json

import pandas as pd
import torch

import xray
from xray.backends.base import ReplayStatus, is_macos
from xray.replay.runner import ReplayConfig, replay_dump
import pytest

pytestmark = pytest.mark.slow  # a real model end to end, a deployment backend or the wheel (.ci/run)


def test_coreml_conversion_status_per_op(tmp_path):
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    w = torch.randn(8, 8, generator=torch.Generator().manual_seed(1))
    with xray.dump(X_DEDUP=True, X_DUMP_NUM=5, dump_dir=tmp_path / "dump") as d:
        y = torch.softmax(x @ w, dim=-1)
        torch.nn.functional.gelu(y)
    result = replay_dump(d.folder, ReplayConfig(backends=["coreml", "coreml-fp16"], out=tmp_path / "out",
                                                repeats=1, progress=False))
    df = pd.read_csv(result.out / "matrix.csv")
    for backend in ("coreml", "coreml-fp16"):
        rows = df[df.backend == backend]
        assert len(rows) == len(result.records) >= 3
        expected = {"OK", "MISMATCH"} if is_macos() else {"UNSUPPORTED_PLATFORM"}
        converted = rows[rows.status.isin(expected)]
        assert len(converted) >= 2, rows[["op", "status", "error"]].to_string()
        assert set(rows.status) <= expected | {"EXPORT_FAIL"}
        for _, row in converted.iterrows():
            facts = json.loads(row.facts)
            assert facts["mil_ops"] >= 1 and facts["package_bytes"] > 0
            assert facts["precision"] == ("fp16" if backend == "coreml-fp16" else "fp32")
            if not is_macos():
                assert "converted" in row.error and "macOS" in row.error
        for _, row in rows[rows.status == "EXPORT_FAIL"].iterrows():
            assert "coremltools" in row.error or "torch.export" in row.error
    if not is_macos():
        assert all(ReplayStatus(r.status) != ReplayStatus.OK for r in result.rows if r.backend.startswith("coreml"))
