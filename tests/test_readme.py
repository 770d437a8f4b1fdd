"""The README's examples run as written: its Python blocks in order in one fresh interpreter,
then its shell commands, in an empty folder (with the repository's example ``dumps/`` beside).
Its tools table names every command there is, its figures are docs/benchmarks.md's, and no user
doc reads as a development log.

Left out, each for a stated reason: the install/test block (it installs, and runs this suite;
.ci/run runs it verbatim) and xray-replay (minutes of exports; tests/test_replay*.py run it).
Without CUDA, the line for "the device under test" runs on the CPU.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib.metadata import distributions
from pathlib import Path

import pytest
import torch

SLOW = pytest.mark.slow  # a real model end to end (.ci/run)

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
NOT_RUN = {"pip install": "installs into the environment; .ci/run runs it verbatim",
           "python -m pytest": "this test suite itself",
           "xray-replay": "minutes of exports; tests/test_replay*.py cover it"}
FOREIGN = re.compile(r"torchao|Failed to load|_pytree|Enum subclass|^W\d{4} ", re.M)


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README, re.S | re.M)


def shell_lines(block: str) -> list[str]:
    return [line.strip() for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRANSFORMERS_VERBOSITY="error")
    if any(e.group == "pytest11" and e.value.startswith("xray") for d in distributions() for e in d.entry_points):
        # an older xray install still registers the plugin globally; the suite's conftest loads it
        env["PYTEST_ADDOPTS"] = (env.get("PYTEST_ADDOPTS", "") + " -p no:xray").strip()
    return env


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("readme")
    (work / "dumps").symlink_to(ROOT / "dumps")
    return work


def test_the_readme_has_the_examples_this_test_runs():
    assert len(blocks("python")) >= 2 and len(blocks("bash")) >= 5


@SLOW
def test_python_blocks_run_as_written(workdir):
    script = workdir / "readme_examples.py"
    script.write_text("\n\n".join(blocks("python")), encoding="utf-8")
    proc = subprocess.run([sys.executable, script.name], cwd=workdir, env=_env(), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(proc.stdout.splitlines()) == 3  # "for r in dump.records[:3]: print(...)"
    assert not FOREIGN.search(proc.stderr), proc.stderr[-3000:]
    assert (workdir / "dump" / "globalrank-0_localrank-0.h5").exists()  # PrecisionDebugger's step 3


def _shell_commands() -> list[str]:
    lines = [line for block in blocks("bash") for line in shell_lines(block)]
    return [line for line in lines if not any(line.startswith(k) for k in NOT_RUN)]


@SLOW
def test_shell_commands_run_as_written(workdir):
    if not (workdir / "dump").exists():
        test_python_blocks_run_as_written(workdir)  # the summary command reads the debugger's dump
    commands = _shell_commands()
    assert any(c.startswith("xray-gen") for c in commands) and any(c.startswith("xray-compare") for c in commands)
    for command in commands:
        if "--device cuda" in command and not torch.cuda.is_available():
            command = command.replace("--device cuda", "--device cpu")
        proc = subprocess.run(["bash", "-c", command], cwd=workdir, env=_env(), capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        assert not FOREIGN.search(proc.stderr), f"{command}\n{proc.stderr[-3000:]}"
    assert (workdir / "diff.csv").exists() and (workdir / "report.html").exists()


def _section(title: str) -> str:
    return README.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_tools_table_names_every_command(capsys):
    """Every console script of pyproject.toml and every ``xray`` subcommand has its row."""
    import tomllib

    from xray.cli import main

    table = _section("The tools")
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    with pytest.raises(SystemExit):
        main(["--help"])
    subcommands = re.search(r"\{([a-z,-]+)\}", capsys.readouterr().out).group(1).split(",")
    named = {" ".join(cell.split()[:2]) if cell.startswith("xray ") else cell.split()[0]
             for row in re.findall(r"^\|([^|]+)\|", table, re.M) for cell in re.findall(r"`([^`]+)`", row)}
    assert named, table
    missing = [s for s in scripts if s != "xray" and s not in named] + [f"xray {c}" for c in subcommands
                                                                      if f"xray {c}" not in named]
    assert not missing, f"README's tools table lacks {missing}"


def test_the_trust_figures_are_the_benchmarks_pages():
    """The README keeps one table of today's figures; each of them is in docs/benchmarks.md."""
    bench = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    trust = _section("How far to trust it")
    figures = re.findall(r"\d[\d,]* of \d[\d,]*(?: \(\d+(?:\.\d+)? %)?", trust)
    assert len(figures) >= 8, trust
    assert not [f for f in figures if f not in bench], "figures not in docs/benchmarks.md"
    assert trust.count("\n|---") == 1 and "docs/benchmarks.md" in trust


def test_user_docs_name_no_milestones():
    """History lives in the commit log: no "stop N", "issue N" or numbered held-out set in the
    README or docs/, and no drafting notes left in a page."""
    pattern = re.compile(r"\b(stop|issue|held-out sets?) #?\d|milestone|For the README", re.I)
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    hits = [f"{p.name}:{n}: {line.strip()[:80]}" for p in pages
            for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert not hits, "\n".join(hits)


def test_user_docs_tell_no_history():
    """Docs hold today's figures and rules: what was fixed when, and the versions before, live in
    the commit log ("fixed since", "at the previous version" read as a changelog, not a figure)."""
    pattern = re.compile(r"\b(fixed|named|clean|exact)( exactly)? since\b|\b(previous|earlier) versions?\b"
                         r"|\bversion before\b|\bthis version's\b", re.I)
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    hits = [f"{p.name}:{n}: {line.strip()[:80]}" for p in pages
            for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert not hits, "\n".join(hits)


def test_the_record_example_quiets_third_party_before_its_first_import_of_them():
    first = blocks("python")[0]
    assert "xray.quiet_third_party()" in first
    assert first.index("xray.quiet_third_party()") < first.index("xray.demo.models")  # imports transformers
