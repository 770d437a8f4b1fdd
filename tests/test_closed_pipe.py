"""Every console script ends quietly when its reader goes away (``xray-compare ... | head``), as
a Unix tool does: exit status 0 and no BrokenPipeError traceback (one helper: xray/console.py)."""
from __future__ import annotations

import importlib
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

from xray.console import closed_pipe_is_quiet
from xray.demo.synthetic import Op, write_dump

ROOT = Path(__file__).resolve().parent.parent
ENV = dict(os.environ, PYTHONPATH=str(ROOT), TRANSFORMERS_VERBOSITY="error")
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
# each entry point as "module:function", and python -m xray.compare's
ENTRIES = {**SCRIPTS, "python -m xray.compare": "xray.compare.distributed:main"}


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_every_console_script_is_wrapped(name):
    """A subprocess per script would cost seconds each; ``--help`` cannot show it either (argparse
    swallows its own write errors). So: each entry point is the helper's wrapper."""
    module, _, func = ENTRIES[name].partition(":")
    main = getattr(importlib.import_module(module), func)
    assert main.__code__ is closed_pipe_is_quiet(lambda argv=None: 0).__code__, f"{name}: wrap its main"


def _into_a_closed_pipe(entry: str, *argv: str) -> tuple[int, str]:
    """Run ``entry`` with ``argv``, its stdout a pipe whose reader has already gone."""
    module, _, func = entry.partition(":")
    proc = subprocess.Popen([sys.executable, "-c", f"import sys; from {module} import {func}; sys.exit({func}())",
                             *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV, cwd=ROOT)
    proc.stdout.close()  # before a byte is read: the script's first write meets a closed pipe
    err = proc.stderr.read().decode()
    return proc.wait(timeout=300), err


@pytest.mark.slow
def test_compare_report_into_a_closed_pipe_is_quiet(tmp_path):
    """``xray-compare A B out.csv | head``: the report is printed after the compare; the CSV is whole."""
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    ops = lambda s: [Op("aten.relu.default", x.relu() * s), Op("aten.neg.default", -x * s)]  # noqa: E731
    a, b = write_dump(tmp_path / "a", ops(1.0)), write_dump(tmp_path / "b", ops(1.01))
    code, err = _into_a_closed_pipe(SCRIPTS["xray-compare"], str(a), str(b), str(tmp_path / "out.csv"),
                                    "--no-progress")
    assert code == 0 and "Traceback" not in err and "BrokenPipe" not in err, err
    assert len((tmp_path / "out.csv").read_text().splitlines()) == 3


@pytest.mark.slow
def test_replay_backend_list_into_a_closed_pipe_is_quiet():
    code, err = _into_a_closed_pipe(SCRIPTS["xray-replay"], "--list-backends")
    assert code == 0 and "Traceback" not in err and "BrokenPipe" not in err, err
