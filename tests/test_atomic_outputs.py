"""Outputs appear whole or not at all (issue 18, item 10).

A failure mid-write used to leave a complete-looking 68-of-163-row CSV over the previous good one,
with the error "error: : File too large" naming no file.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

import xray
from xray.dump.atomic import OutputWriteError, atomic_write


def test_a_failed_write_keeps_the_previous_file(tmp_path):
    out = tmp_path / "out.csv"
    out.write_text("previous good content\n")
    with pytest.raises(RuntimeError):
        with atomic_write(out) as f:
            f.write("half of the new")
            raise RuntimeError("killed mid-write")
    assert out.read_text() == "previous good content\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.csv"]  # no temporary left behind


def test_an_os_error_names_the_file(tmp_path):
    target = tmp_path / "missing_folder" / "out.csv"
    with pytest.raises(OutputWriteError, match="cannot write .*missing_folder/out.csv"):
        with atomic_write(target) as f:
            f.write("x")


FULL_DISK = textwrap.dedent("""
    import resource, signal, sys
    from xray.compare.cli import main
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[4]), int(sys.argv[4])))
    sys.exit(main([sys.argv[1], sys.argv[2], sys.argv[3], "--no-progress"]))
""")


@pytest.mark.slow
def test_compare_on_a_full_disk_keeps_the_previous_csv_and_names_it(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(64, 64)
    folders = []
    for name in ("a", "b"):
        with xray.dump(dump_dir=tmp_path / name, X_DEDUP=False, X_DUMP_NUM=0) as d:
            y = x
            for _ in range(40):
                y = torch.tanh(y @ x)
        folders.append(d.folder)
    good = tmp_path / "out.csv"
    ok = subprocess.run([sys.executable, "-m", "xray.compare.cli", str(folders[0]), str(folders[1]), str(good),
                         "--no-progress"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    before = good.read_bytes()
    limit = len(before) // 2  # the next full CSV cannot fit
    proc = subprocess.run([sys.executable, "-c", FULL_DISK, str(folders[0]), str(folders[1]), str(good), str(limit)],
                          capture_output=True, text=True)
    assert proc.returncode != 0
    assert good.read_bytes() == before, "the previous CSV was overwritten by a partial one"
    assert "out.csv" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-1500:]
    assert not list(tmp_path.glob(".out.csv*"))
