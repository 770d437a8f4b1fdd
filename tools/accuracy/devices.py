"""The real cross-device set: CPU fp32 bench vs NVIDIA H100 targets, recorded on real hardware.

tests/fixtures/cuda-h100/ holds one archive per architecture (llama, gpt2, bert, vit; made by
xray dac56dc on an H100 with torch 2.11+cu130, see its README) and ``manifest.json`` with the
ground truth: for each fault run the corrupted call's seq in the target dump and its module.
Each target is compared with its architecture's ``cpu_fp32`` bench. A fault run is an exact hit
when the first divergence names that seq, right module when it names a record of that module;
a legitimate run (fp32, TF32, bf16, fp16 autocast) is clean when it has no FAIL or NaN/Inf row
and no first divergence. A compare that raises is a crash, and never right.

``judge`` is the one scorer: tools/device_check.py scores the runs it records on a device with it.
"""
from __future__ import annotations

import json
import shutil
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "cuda-h100"
# tools/device_check.py's runs on an NVIDIA H200 (torch 2.11+cu130): llama and resnet, fp32,
# bf16 autocast (cuBLAS' reduced-precision split-K allowed, torch's default) and a bf16 fault
H200_FIXTURES = FIXTURES.with_name("cuda-h200")


@dataclass
class DeviceOutcome:
    key: str  # "<arch>/<variant>"
    arch: str
    variant: str
    fault: bool
    fail_rows: int = 0
    rows: int = 0
    fd_target_seq: int | None = None
    fd_module: str | None = None
    fd_op: str | None = None
    exact: bool | None = None  # faults only
    right_module: bool | None = None
    clean: bool | None = None  # legitimate runs only
    crash: str | None = None
    seconds: float = 0.0
    first_divergence: dict | None = None
    counts: dict | None = None  # rows per status

    @property
    def right(self) -> bool:
        """An exact hit for a fault run, clean for a legitimate one; a crash is never right."""
        return self.crash is None and bool(self.exact if self.fault else self.clean)


def unpack(into: Path | None = None, fixtures: Path = FIXTURES) -> Path:
    """The archives extracted under ``into`` (a new temporary folder by default); returns the
    folder that holds manifest.json and one folder per architecture."""
    root = Path(into or tempfile.mkdtemp(prefix="xray-cuda-h100-"))
    for archive in sorted(fixtures.glob("*.tar.gz")):
        if not (root / archive.name.removesuffix(".tar.gz")).is_dir():
            with tarfile.open(archive) as tf:
                tf.extractall(root, filter="data")
    (root / "manifest.json").write_text((fixtures / "manifest.json").read_text())
    return root


def manifest(root: Path) -> dict:
    return json.loads((root / "manifest.json").read_text())["dumps"]


def _inside(path: str | None, parent: str) -> bool:
    from xray.compare.entry_table import normalize_path

    p, q = normalize_path(path), normalize_path(parent)
    return p == q or p.startswith(q + ".")


def score(root: Path, key: str, entry: dict, statistics_only: bool = False) -> DeviceOutcome:
    """Compare one target of the fixtures with its bench and score it against the manifest's ground truth."""
    bench = manifest(root).get(f"{entry['arch']}/cpu_fp32", {}).get("path", f"{entry['arch']}/cpu_fp32/proc_480")
    return judge(root / bench, root / entry["path"], entry, key, statistics_only)


def judge(bench: Path | str, target: Path | str, truth: dict, key: str | None = None,
          statistics_only: bool = False) -> DeviceOutcome:
    """Compare ``target`` with ``bench`` and score the verdict against ``truth`` (``arch``,
    ``variant`` and, for a fault run, ``fault_target_seq`` and ``fault_module``);
    ``statistics_only``: on their statistics alone (compare's --statistics-only)."""
    from xray.compare import compare_dumps

    arch = truth["arch"]
    o = DeviceOutcome(key or f"{arch}/{truth['variant']}", arch, truth["variant"], fault="fault_target_seq" in truth)
    started = time.perf_counter()
    try:
        r = compare_dumps(bench, target, progress=False, statistics_only=statistics_only)
    except Exception as e:  # noqa: BLE001 -- a crash is a result of the benchmark, listed
        o.crash = f"{type(e).__name__}: {e}"
        o.seconds = time.perf_counter() - started
        return o
    o.seconds = time.perf_counter() - started
    s = r.summary
    o.rows, o.fail_rows, o.counts = s.rows, s.failed + s.nan_inf, r.status_counts()
    o.first_divergence = s.first_divergence or None
    fd = o.first_divergence or {}
    o.fd_target_seq, o.fd_module, o.fd_op = fd.get("target_seq"), fd.get("module"), fd.get("target_op") or fd.get("op")
    if o.fault:
        # a corrupted call with no bench counterpart is named as the consumer's culprit
        o.exact = truth["fault_target_seq"] in (fd.get("target_seq"), fd.get("culprit_target_seq"))
        o.right_module = bool(fd) and _inside(fd.get("module"), truth["fault_module"])
    else:
        o.clean = o.fail_rows == 0 and not fd
    return o


def statistics_only(root: Path, into: Path | None = None) -> Path:
    """A copy of the unpacked fixtures without their tensor files: every pair is then judged by
    its statistics, as a statistics-only recording of the same runs would be (the usual
    recording on a device). Compare reads the missing data as unreadable and says so once;
    ``--statistics-only`` (``score(..., statistics_only=True)``) gives the same view unread."""
    out = Path(into or tempfile.mkdtemp(prefix="xray-cuda-h100-stats-"))
    shutil.copytree(root, out, ignore=shutil.ignore_patterns("tensors-*.h5"), dirs_exist_ok=True)
    return out


def run(root: Path | None = None, statistics: bool = False) -> list[DeviceOutcome]:
    """Score every target of the fixtures; ``statistics``: on their statistics alone."""
    root = root or unpack()
    return [score(root, key, e, statistics) for key, e in manifest(root).items() if e["variant"] != "cpu_fp32"]


HEADERS = ["real device set", "runs", "exact hit %", "right module %", "clean (no FAIL, no divergence)",
           "FAIL rows", "crashes"]


def table(outcomes: list[DeviceOutcome]) -> list[list]:
    """One row for the fault runs, one per legitimate variant, one overall."""
    def pct(n: int, d: int) -> str:
        return f"{100.0 * n / d:.1f}" if d else "-"

    faults = [o for o in outcomes if o.fault]
    rows = [["faults (fp32 1e-3, tf32 1e-2, bf16 5e-2)", len(faults), pct(sum(bool(o.exact) for o in faults), len(faults)),
             pct(sum(bool(o.right_module) for o in faults), len(faults)), "-", "-", sum(o.crash is not None for o in faults)]]
    for variant in sorted({o.variant for o in outcomes if not o.fault}):
        legit = [o for o in outcomes if o.variant == variant]
        rows.append([f"legitimate {variant}", len(legit), "-", "-", f"{sum(bool(o.clean) for o in legit)}/{len(legit)}",
                     sum(o.fail_rows for o in legit), sum(o.crash is not None for o in legit)])
    legit = [o for o in outcomes if not o.fault]
    rows.append(["overall", len(outcomes), pct(sum(bool(o.exact) for o in faults), len(faults)),
                 pct(sum(bool(o.right_module) for o in faults), len(faults)),
                 f"{sum(bool(o.clean) for o in legit)}/{len(legit)}", sum(o.fail_rows for o in legit),
                 sum(o.crash is not None for o in outcomes)])
    return rows


def totals(outcomes: list[DeviceOutcome]) -> dict:
    faults = [o for o in outcomes if o.fault]
    legit = [o for o in outcomes if not o.fault]
    return {"runs": len(outcomes), "faults": len(faults), "legitimate": len(legit),
            "exact_pct": 100.0 * sum(bool(o.exact) for o in faults) / max(len(faults), 1),
            "right_module_pct": 100.0 * sum(bool(o.right_module) for o in faults) / max(len(faults), 1),
            "legit_clean": sum(bool(o.clean) for o in legit),
            "legit_fail_rows": sum(o.fail_rows for o in legit), "crashes": sum(o.crash is not None for o in outcomes)}
