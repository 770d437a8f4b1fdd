"""The compare report and terminal output a person reads (issue 33): a x1.01 scaling bug is
visible, a clean report has no empty tables, names keep module and op, the module tree marks
the first divergence, rows link to their generated tests, a headless browser renders it, and
progress is a bar on a terminal and plain lines in a log."""
from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ScaleNthMM, record_forward
from xray.compare import compare_dumps
from xray.compare.report import (_cosine_distance, _relative_error, _short, module_tree_html, terminal_report,
                                 worst_table, write_html)
from xray.demo.models import tiny_llama, token_batch

REPO = Path(__file__).resolve().parents[1]
SCALE = 1.01  # the scaling bug: every element 1% too large, direction unchanged


# One worker builds the real-size dumps once for the whole module (pyproject's --dist loadgroup):
# split across two workers, each recorded them (23 s apiece).
pytestmark = pytest.mark.xdist_group("report")


def _record(model, folder: Path, fault: ScaleNthMM | None = None) -> Path:
    ids = token_batch(batch=1, seq=512, vocab=model.config.vocab_size)
    return record_forward(model, folder, ids, fault, X_DEDUP=False, X_DUMP_NUM=100, X_DEBUG=0x112)


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    """A real-size Llama layer (hidden 1024, 512 tokens, GQA): clean, a copy of it (a CPU run
    records the same values again, so a second recording would only cost 7 s), and with a x1.01 bug."""
    tmp = tmp_path_factory.mktemp("report")
    model = tiny_llama(layers=1, hidden=1024, heads=16, kv_heads=4, vocab=1000)
    bench = _record(model, tmp / "bench")
    same = tmp / "same" / bench.relative_to(tmp / "bench")
    shutil.copytree(tmp / "bench", tmp / "same")
    return tmp, bench, same, _record(model, tmp / "scaled", ScaleNthMM(3, SCALE))


@pytest.fixture(scope="module")
def scaled(dumps):
    tmp, bench, _, target = dumps
    return compare_dumps(bench, target)


@pytest.fixture(scope="module")
def clean(dumps):
    tmp, bench, same, _ = dumps
    return compare_dumps(bench, same)


@pytest.mark.slow
def test_a_scaling_bug_is_visible_on_the_plotted_axis(scaled):
    fd = scaled.summary.first_divergence
    assert fd is not None
    row = scaled.rows[fd["index"]]
    # what the top panel plots: the relative error of a x1.01 scaling is 0.01
    assert _relative_error(row) == pytest.approx(SCALE - 1, rel=1e-3)
    # 1 - cosine is blind to it (drawn at the floor region, nowhere near 1e-2)
    assert _cosine_distance(row) < 1e-9


@pytest.mark.slow
def test_clean_report_has_no_empty_tables(clean, tmp_path):
    assert clean.summary.failed == 0
    html = tmp_path / "r.html"
    write_html(clean, html)
    text = html.read_text()
    assert "No row failed." in text
    for heading in ("Worst rows", "Local vs accumulated", "Unmatched ("):
        assert heading not in text
    assert not re.search(r"<table>\s*(<thead>\s*<tr>.*?</tr>\s*</thead>)?\s*(<tbody>\s*</tbody>)?\s*</table>", text)


@pytest.mark.slow
def test_module_tree_marks_the_first_divergence(scaled, tmp_path):
    fd = scaled.summary.first_divergence
    tree = module_tree_html(scaled.rows, fd["module"])
    assert "◀ first divergence" in tree
    marked = re.findall(r'class="(\w+) first">([^<]*)', tree)
    assert marked and all(css in ("fail", "nan") for css, _ in marked)  # the path down to it is failing
    leaf = marked[-1][1]
    assert leaf.startswith(fd["module"].split(".")[-1]) and "first divergence" in leaf


@pytest.mark.slow
def test_rows_link_to_their_generated_tests(dumps, scaled, tmp_path):
    _, _, _, target = dumps
    gen = subprocess.run([sys.executable, "-m", "xray.gen.cli", str(target), "-o", str(tmp_path / "tests"),
                          "--factory", "random", "--quiet"], capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert gen.returncode == 0, gen.stderr
    html = tmp_path / "out" / "r.html"
    html.parent.mkdir()
    write_html(scaled, html, tests=tmp_path / "tests")
    links = re.findall(r'<a href="([^"]+)">', html.read_text())
    assert links and all((html.parent / link).is_file() for link in links)
    assert "../tests/test_aten_mm_default.py" in links


def test_worst_rows_keep_module_and_op():
    name = "model.layers.0.self_attn.q_proj/aten.mm.default#384"
    assert _short(name, 60) == name
    assert _short(name, 40) == "model.layers.0.self_attn.q_proj/mm#384"
    assert _short(name, 30) == "…0.self_attn.q_proj/mm#384"
    assert _short(name, 20) == "…q_proj/mm#384"
    assert _short("x" * 80, 20).startswith("…")
    assert _short("model.layers.0.self_attn.v_proj.Linear.0.forward", 40) == "…0.self_attn.v_proj.Linear.0.forward"


@pytest.mark.slow
def test_terminal_report_reads_well(scaled):
    text = terminal_report(scaled)
    cause = next(line for line in text.splitlines() if line.strip().startswith("cause:"))
    assert cause.count("local error") <= 1, cause
    worst = worst_table([r for r in scaled.rows if r.status == "fail"][:10])
    assert "…default#" not in worst and "…ayers" not in worst  # names keep their module and op
    assert re.search(r"self_attn\.v_proj/(aten\.)?mm#", worst)


@pytest.mark.parametrize("where", ["missing folder", "a folder"])
def test_compare_names_the_file_it_cannot_write_before_comparing(tmp_path, where):
    """The output is checked first: a long compare never ends in an unwritable path."""
    out = "/nonexistent/out.csv" if where == "missing folder" else str(tmp_path)
    dump = REPO / "dumps" / "llama-fp32"
    r = subprocess.run([sys.executable, "-m", "xray.compare.cli", str(dump), str(dump), out, "--no-progress"],
                       capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.returncode == 2
    reason = "No such file or directory" if where == "missing folder" else "Is a directory"
    assert r.stderr.strip() == f"xray-compare: error: cannot write {out}: {reason}"


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_report_renders_in_a_headless_browser(scaled, tmp_path):
    """The screenshot is not blank and the page logs no console error."""
    html = tmp_path / "r.html"
    write_html(scaled, html)
    shot = tmp_path / "shot.png"
    r = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                        "--v=0", f"--screenshot={shot}", "--window-size=1280,2000", html.as_uri()],
                       capture_output=True, text=True, timeout=120)
    assert shot.is_file(), r.stderr[-2000:]
    console = [line for line in r.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert not console, console
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)
    assert pixels.shape[0] >= 1000 and pixels.shape[1] >= 1000
    # not blank: many distinct colours (text, the plot's points in three colours, the tree's)
    distinct = {tuple(p) for p in (pixels[::7, ::7, :3] * 255).astype(int).reshape(-1, 3).tolist()}
    assert len(distinct) > 50
    assert (pixels[..., :3] < 0.5).mean() > 0.005  # some dark ink on the page


def test_progress_is_plain_lines_in_a_log():
    from xray.progress import PlainProgress, progress

    log = io.StringIO()  # not a terminal
    bar = progress(total=10 << 20, desc="compare", unit="B", unit_scale=True, file=log, every_s=0.0)
    assert isinstance(bar, PlainProgress)
    for _ in range(10):
        bar.update(1 << 20)
    bar.close()
    lines = log.getvalue().splitlines()
    assert len(lines) == 11 and "\r" not in log.getvalue()
    assert all(len(line) < 100 for line in lines)
    assert lines[-1].startswith("compare: 10.5 MB of 10.5 MB (100%)") and lines[-1].endswith("done")
    quiet = io.StringIO()
    list(progress(range(5), file=quiet, enabled=False))
    assert quiet.getvalue() == ""


def test_progress_is_a_bar_on_a_terminal():
    import pty

    from tqdm import tqdm

    from xray.progress import progress

    leader, follower = pty.openpty()
    with os.fdopen(follower, "w") as term:
        bar = progress(range(3), desc="replay", file=term)
        assert isinstance(bar, tqdm)
        list(bar)
    os.close(leader)


@pytest.mark.slow
def test_xray_gen_progress_in_a_log_has_no_carriage_returns(dumps, tmp_path):
    _, bench, _, _ = dumps
    r = subprocess.run([sys.executable, "-m", "xray.gen.cli", str(bench), "-o", str(tmp_path / "t"), "--factory",
                        "random"], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.returncode == 0, r.stderr
    assert "\r" not in r.stderr and all(len(line) < 300 for line in r.stderr.splitlines())
