"""A real wheel, installed into a fresh environment: the templates travel with it, the console
scripts run outside the checkout, and no pytest plugin is registered globally.

The venv sees the site-packages of the interpreter running the tests (torch and the rest come
from there, nothing is downloaded), whether that interpreter is a system Python or itself a
venv; xray itself comes only from the wheel (PYTHONPATH is cleared, cwd is outside the
repository, and the venv's own site-packages, which holds the wheel, comes first).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pandas as pd
import pytest

pytestmark = pytest.mark.slow  # a real model end to end, a deployment backend or the wheel (.ci/run)

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "setup.py", "README.md", "xray", "templates")


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    return dict(env, TRANSFORMERS_VERBOSITY="error", PIP_DISABLE_PIP_VERSION_CHECK="1")


STALE_PLUGIN = ("from importlib.metadata import distributions as d\n"
                "print(any(e.group == 'pytest11' and e.value.startswith('xray') for x in d() for e in x.entry_points))")


def _stale_global_plugin(python: Path, cwd: Path) -> bool:
    """Whether an older xray install visible to ``python`` (the test interpreter's, see
    ``_see_this_environment``) still registers xray's plugin globally, under the entry-point name
    "xray". Reinstalling xray (pip install -e .) removes it."""
    return _run([python, "-c", STALE_PLUGIN], cwd=cwd).stdout.strip() == "True"


def _run(cmd: list, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=_clean_env(), capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


def _site_dirs() -> list[str]:
    """The site-packages folders this interpreter imports from (a venv's own and, if it has
    --system-site-packages, its base's; the user site when enabled)."""
    return [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()]


def _see_this_environment(python: Path, cwd: Path) -> None:
    """Let the venv of ``python`` import what this interpreter imports.

    ``venv --system-site-packages`` would show it the *base* interpreter's packages, which lack
    the dependencies when the tests run from a venv of their own. A .pth file in the venv's
    site-packages adds this interpreter's site folders after the venv's own, with their .pth
    files processed (site.addsitedir), as the system site-packages would be."""
    purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd=cwd).stdout.strip()
    lines = [f"import site; site.addsitedir({d!r})" for d in _site_dirs()]
    (Path(purelib) / "_xray_test_outer_site.pth").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(the wheel, the venv's bin folder): built from a copy of the checkout, so no build output
    lands in the repository, and installed with --no-deps into a venv without pip of its own."""
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.pyc")
    for name in SOURCES:
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy2)(ROOT / name, src / name, **(
            {"ignore": ignore} if (ROOT / name).is_dir() else {}))
    _run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "-q", "-w", root / "dist"],
         cwd=src)
    wheel = next((root / "dist").glob("xray_probe-*.whl"))
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=root)
    python = venv / "bin" / "python"
    _see_this_environment(python, root)
    _run([python, "-m", "pip", "install", "-q", "--no-deps", wheel], cwd=root)
    return wheel, venv / "bin"


def test_wheel_carries_the_templates_and_registers_no_pytest_plugin(installed):
    wheel, bin_dir = installed
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        entry_points = next(z.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    assert {f"xray/_templates/{p.name}" for p in (ROOT / "templates").glob("*.j2")} <= names
    assert "xray/_templates/conftest.py.j2" in names
    assert "pytest11" not in entry_points and "xray-gen = xray.gen.cli:main" in entry_points
    where = _run([bin_dir / "python", "-c", "import xray.gen.generator as g; print(g.templates_dir())"],
                 cwd=wheel.parent)
    assert where.stdout.strip().endswith("site-packages/xray/_templates")


def test_installed_wheel_runs_the_readme_commands(installed, tmp_path):
    _, bin_dir = installed
    dumps = ROOT / "dumps"
    gen = _run([bin_dir / "xray-gen", dumps / "llama-dedup" / "dump.json", "-o", "pytests/"], cwd=tmp_path)
    assert "48 tests" in gen.stdout
    assert (tmp_path / "pytests" / "conftest.py").exists()
    stale = ["-p", "no:xray"] if _stale_global_plugin(bin_dir / "python", tmp_path) else []  # see below
    run = _run([bin_dir / "python", "-m", "pytest", "pytests/", "--device", "cpu", "--seed", "42",
                "--detail_compare_path=./result.csv", "-q", "-p", "no:cacheprovider", *stale], cwd=tmp_path)
    assert "48 passed" in run.stdout
    assert len(pd.read_csv(tmp_path / "result.csv")) == 48
    compare = _run([bin_dir / "xray-compare", dumps / "llama-fp32", dumps / "llama-bf16-fault", "out.csv"],
                   cwd=tmp_path)
    assert "FIRST DIVERGENCE" in compare.stdout
    summary = _run([bin_dir / "xray-summary", dumps / "llama-module.h5", "--match", r"layers\.0\."], cwd=tmp_path)
    assert "layers.0." in summary.stdout


def test_a_project_with_its_own_device_option_runs_beside_xray(installed, tmp_path):
    """Before, xray's global plugin added --device to every pytest session: this conftest failed
    with "option names {'--device'} already added"."""
    _, bin_dir = installed
    if _stale_global_plugin(bin_dir / "python", tmp_path):
        pytest.skip("an older xray installed outside the venv still registers the plugin globally; "
                    "reinstall xray (pip install -e .) to run this check")
    (tmp_path / "conftest.py").write_text(
        "import pytest\n\n"
        "def pytest_addoption(parser):\n    parser.addoption('--device', default='npu:0')\n\n"
        "@pytest.fixture\ndef device(request):\n    return request.config.getoption('--device')\n")
    (tmp_path / "test_mine.py").write_text("def test_device(device):\n    assert device == 'npu:3'\n")
    run = _run([bin_dir / "python", "-m", "pytest", ".", "--device", "npu:3", "-q", "-p", "no:cacheprovider"],
               cwd=tmp_path)
    assert "1 passed" in run.stdout
