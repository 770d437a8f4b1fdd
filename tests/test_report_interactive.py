"""The HTML compare report is a page to work in (issue 49): in a real headless browser, clicking
a plot point selects its row, a column header sorts, the filter hides rows that do not match,
numbers read at 3 digits, and a name from the dump can neither run script nor reorder text.
The rows are built directly (the compare data model), so this takes seconds, not a recording."""
from __future__ import annotations

import html as htmllib
import json
import re
import shutil
import subprocess

import pytest

from xray.compare.report import write_html
from xray.compare.report_page import page_rows, script_json
from xray.compare.result import CompareResult, CompareRow, Summary

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
HOSTILE = '</script><script>document.title="pwned"</script>\u202eevil\u2028'


def _result() -> CompareResult:
    """Two Llama-like layers: passing rows, then a x1.01 bug born at layer 0's v_proj that the
    rows after it inherit; one name is hostile."""
    rows, i = [], 0
    for layer in range(2):
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj", "mlp.up_proj", "mlp.down_proj"):
            module = f"layers.{layer}.{'self_attn.' if 'mlp' not in proj else ''}{proj}"
            for op in ("mm", "add", "mul"):
                bad = i >= 6  # from layer 0's v_proj on
                err = 0.01 * (1 + i / 10) if bad else 1e-7 * (1 + i)
                name = f"model.{module}/aten.{op}.default#{i}"
                rows.append(CompareRow(
                    index=i, status="fail" if bad else "pass",
                    origin="born" if i == 6 else ("inherited" if bad else ""),
                    bench_name=HOSTILE if i == 3 else name, target_name=name, module=module,
                    bench_op=f"aten.{op}.default",
                    tensor="out0", mode="data", cosine=1 - err ** 2, rel_rmse=err, max_abs_err=err * 3.1,
                    isclose_pct=100.0 if not bad else 42.0, layout=""))
                i += 1
    s = Summary(bench="bench", target="target", rows=len(rows), failed=sum(r.status == "fail" for r in rows),
                passed=sum(r.status == "pass" for r in rows), verdict_kind="bug",
                verdict="bug born at aten.mm.default in model.layers.0.self_attn.v_proj")
    s.first_divergence = {"index": 6, "rank": "", "origin": "born", "bench": rows[6].bench_name,
                          "target": rows[6].target_name, "tensor": "out0", "module": rows[6].module, "layout": ""}
    return CompareResult(rows, s)


# Runs after the page's own script: clicks, sorts and filters as a person would, and writes what
# the DOM then shows into #probe for the test to read from the dumped page.
PROBE = """<script>
(function () {
  var out = {};
  function shown() {
    return Array.prototype.map.call(document.querySelectorAll("#rows tbody tr"), function (tr) {
      return {id: tr.getAttribute("data-row"), selected: tr.getAttribute("aria-selected"),
              cells: Array.prototype.map.call(tr.cells, function (td) { return td.textContent; })};
    });
  }
  out.heads = Array.prototype.map.call(document.querySelectorAll("#rows th"), function (th) {
    return th.getAttribute("data-key");
  });
  out.before = shown();
  var point = document.querySelector("#plot circle[data-row]");
  out.point = point.getAttribute("data-row");
  point.dispatchEvent(new MouseEvent("click", {bubbles: true}));
  out.clicked = shown().filter(function (r) { return r.selected === "true"; }).map(function (r) { return r.id; });
  out.point_marked = point.classList.contains("sel");
  var th = document.querySelector('#rows th[data-key="max_abs_err"]');
  th.click();
  out.sorted = shown(); out.sort = th.getAttribute("aria-sort");
  th.click();
  out.sort_again = th.getAttribute("aria-sort"); out.sorted_again = shown();
  var f = document.getElementById("filter");
  f.value = "k_proj";
  f.dispatchEvent(new Event("input", {bubbles: true}));
  out.filtered = shown();
  out.title = document.title;
  var pre = document.createElement("pre"); pre.id = "probe"; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script></body>"""


# One worker builds the rendered page in a headless browser once for the module (pyproject's --dist loadgroup).
pytestmark = pytest.mark.xdist_group("report_page")


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    tmp = tmp_path_factory.mktemp("interactive")
    report = tmp / "r.html"
    write_html(_result(), report)
    text = report.read_text()
    probed = tmp / "probed.html"
    probed.write_text(text.replace("</body>", PROBE))
    r = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
                        "--dump-dom", probed.as_uri()],
                       capture_output=True, text=True, timeout=120)
    m = re.search(r'<pre id="probe">(.*?)</pre>', r.stdout, re.S)
    assert m, (r.stdout[-2000:], r.stderr[-3000:])
    errors = [line for line in r.stderr.splitlines() if "Uncaught" in line or ("CONSOLE" in line and "ERROR" in line)]
    return text, json.loads(htmllib.unescape(m.group(1))), errors


def test_page_runs_without_errors_and_offline(page):
    text, probe, errors = page
    assert not errors, errors
    assert not re.search(r'<(script|link|img)[^>]+(src|href)="(https?:)?//', text)  # nothing fetched


def test_clicking_a_plot_point_selects_its_row(page):
    _, probe, _ = page
    assert probe["clicked"] == [probe["point"]]
    assert probe["point_marked"]


def test_a_column_header_sorts_the_rows(page):
    _, probe, _ = page
    col = probe["heads"].index("max_abs_err")
    ids = [r["id"] for r in probe["before"]]
    assert ids == sorted(ids, key=int)  # execution order at first
    assert probe["sort"] == "descending" and probe["sort_again"] == "ascending"
    key = [float(r["cells"][col].replace("\u2212", "-")) for r in probe["sorted"]]
    assert key == sorted(key, reverse=True) and [r["id"] for r in probe["sorted"]] != ids
    again = [float(r["cells"][col]) for r in probe["sorted_again"]]
    assert again == sorted(again)


def test_the_filter_hides_rows_that_do_not_match(page):
    _, probe, _ = page
    bench, target = probe["heads"].index("bench_name"), probe["heads"].index("target_name")
    assert 0 < len(probe["filtered"]) < len(probe["before"])
    assert all("k_proj" in r["cells"][bench] + r["cells"][target] for r in probe["filtered"])


def test_numbers_read_at_three_digits(page):
    _, probe, _ = page
    col, cos = probe["heads"].index("max_abs_err"), probe["heads"].index("cosine")
    first = probe["before"][0]["cells"]
    assert first[col] == "3.10e-7"  # 3.1e-07: small values in exponent form
    assert first[cos] == "1"  # 1 - 1e-14 travels as 1 (6 digits): shown exact, not "1.00"
    assert probe["before"][10]["cells"][col] == "0.0620"  # 0.062 at three significant digits
    assert probe["before"][6]["cells"][cos] == "1\u22122.56e-4"  # near 1: the distance is what tells


def test_names_from_the_dump_cannot_run_or_reorder(page):
    text, probe, _ = page
    assert probe["title"] == "xray-compare"  # the hostile name's script never ran
    assert text.count("</script>") == 2 and "\u202e" not in text and "\u2028" not in text
    bench = probe["heads"].index("bench_name")
    assert probe["before"][3]["cells"][bench].startswith('</script><script>document.title="pwned"')
    assert "\\u202eevil" in probe["before"][3]["cells"][bench]  # shown as its escape


def test_first_divergence_and_verdict_lead_the_page(page):
    text, _, _ = page
    top = text[:text.index('<svg id="plot"')]
    assert "verdict: bug" in top and 'First divergence</b>: <a href="#row-6"' in top
    assert top.index("verdict: bug") < top.index("First divergence") < top.index("records bench / target")


def test_the_module_tree_filters_the_table():
    from xray.compare.report import module_tree_html

    result = _result()
    tree = module_tree_html(result.rows, "layers.0.self_attn.v_proj")
    assert '<button class="mod" data-module="layers.0.self_attn.k_proj">' in tree


def test_embedded_json_cannot_end_its_script():
    text = script_json({"name": "</script><!--\u2028\u2029&"})
    assert "<" not in text and "\u2028" not in text and "\u2029" not in text
    assert json.loads(text) == {"name": "</script><!--\u2028\u2029&"}


def test_a_huge_compare_keeps_every_failing_row():
    rows = [CompareRow(index=i, status="fail" if i % 100 == 7 else "pass") for i in range(10_000)]
    kept = page_rows(rows, limit=1000)
    assert len(kept) == 1000 and kept == sorted(kept)
    assert {i for i in kept if rows[i].status == "fail"} == {i for i in range(10_000) if i % 100 == 7}
