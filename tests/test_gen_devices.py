"""Generated tests on the device under test (issue 29).

A suite generated from a dump recorded on CUDA (the real H100 fixtures) passes on CPU: the
CUDA attention kernel's test calls the public op, so CPU picks its own kernel. A test whose op
has no kernel on the device, or whose device is absent, is a SKIP with the reason, never a FAIL.
"""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from accuracy import devices  # noqa: E402
from xray.gen.runtime import OpCheck, T  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def real_pairs(tmp_path_factory):
    return devices.unpack(tmp_path_factory.mktemp("cuda-h100"))


@pytest.mark.slow
@pytest.mark.parametrize("run", [pytest.param("gpt2/cuda_fp32", marks=pytest.mark.slow), "llama/cuda_bf16"])
def test_suite_generated_from_a_cuda_dump_passes_on_cpu(real_pairs, tmp_path, run):
    out = tmp_path / "suite"
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    gen = subprocess.run([sys.executable, "-m", "xray.gen.cli", str(real_pairs / run / "proc_480"), "-o", str(out), "-q"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert gen.returncode == 0, gen.stderr[-2000:]
    assert any("scaled_dot_product" in p.name for p in out.glob("test_*.py"))  # the CUDA-only kernel is there
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(out), "--device", "cpu",
                          "-rs"], capture_output=True, text=True, env=env, timeout=900, cwd=out)
    assert res.returncode == 0, res.stdout[-3000:]
    assert " failed" not in res.stdout and " passed" in res.stdout


def test_op_without_a_kernel_on_the_device_is_a_skip_with_its_reason(tmp_path):
    rows = []
    check = OpCheck("t_cslt", tmp_path, device="cpu", on_row=rows.append)
    with pytest.raises(pytest.skip.Exception, match="has no kernel on cpu"):
        check.check(torch.ops.aten._cslt_compress.default, T((4, 4), torch.float32, lo=-1.0, hi=1.0, mean=0.0))
    assert rows and "skipped" in str(rows[-1])


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_absent_device_is_a_skip_not_a_fail(tmp_path):
    check = OpCheck("t_add", tmp_path, device="cuda")
    with pytest.raises(pytest.skip.Exception, match="not available"):
        check.check(torch.ops.aten.add.Tensor, T((2, 2), torch.float32, lo=0.0, hi=1.0, mean=0.5),
                    T((2, 2), torch.float32, lo=0.0, hi=1.0, mean=0.5))
