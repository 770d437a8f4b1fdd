"""torch.compile (inductor) and ExecuTorch's portable kernels on a few real ops, plus presets with overrides."""
from __future__ import annotations

import pytest
import torch

import xray
from xray.backends.base import ReplayStatus
from xray.backends.registry import UnknownBackendError, create
from xray.replay.runner import ReplayConfig, replay_dump

pytestmark = pytest.mark.slow  # a real model end to end, a deployment backend or the wheel (.ci/run)


def test_compile_and_portable(tmp_path):
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(6, 16, generator=g), torch.randn(16, 8, generator=g)
    with xray.dump(X_DEDUP=True, X_DUMP_NUM=5, dump_dir=tmp_path / "dump") as d:
        y = torch.mm(x, w)
        y = torch.softmax(y, dim=-1)
        torch.rsqrt(y + 1.0)
    result = replay_dump(d.folder, ReplayConfig(backends=["torch-compile", "executorch-portable"],
                                                out=tmp_path / "out", repeats=1, progress=False))
    assert len(result.records) == 4  # mm, _softmax, add, rsqrt
    for r in result.rows:
        assert r.status == ReplayStatus.OK, (r.op, r.backend, r.error)
    portable = [r for r in result.rows if r.backend == "executorch-portable"]
    assert all(r.facts["delegated_nodes"] == 0 and r.facts["undelegated_nodes"] >= 1 for r in portable)


def test_preset_overrides():
    b = create("onnxrt-cpu:opset=18,threads=2")
    assert b.options["opset"] == 18 and b.options["threads"] == 2 and b.name == "onnxrt-cpu:opset=18,threads=2"
    assert create("coreml-fp16").tolerance_dtype(torch.float32) == torch.float16
    with pytest.raises(UnknownBackendError, match="presets: torch-cpu"):
        create("tflite")
    with pytest.raises(UnknownBackendError, match="key=value"):
        create("onnxrt-cpu:opset")
