"""Benchmark how well xray-compare finds the first divergence: injected faults and noise-only runs.

Each scenario records a bench run and a target run of a real transformers model (Llama with
sdpa and eager attention, Qwen2, GPT-2, BERT, T5, ViT; tiny configs, random weights) with
``xray.begin_dump`` (X_DEDUP=False) or ``PrecisionDebugger``, compares them with
``xray.compare.compare_dumps`` and scores the summary's ``first_divergence`` against the
ground truth read from the dumps. Faults are injected by a dispatch mode entered before the
recorder, so the recorder records the corrupted output as the op's own (tools/accuracy/).
It measures whatever xray is on PYTHONPATH, so the same run can be made before and after a change:

    PYTHONPATH=/path/to/xray python tools/bench_accuracy.py [--quick] [--csv out.csv] [--json out.json]

Reports per fault class: exact hit % (named the corrupted call), right module % (named a
record in its module); per noise kind: false-fail rows %, scenarios with any FAIL row; crashes
(exceptions from xray, caught per scenario and listed). Definitions: tools/accuracy/report.py.

Beside the CPU sets, the real cross-device set (tools/accuracy/devices.py): dumps recorded on an
NVIDIA H100 (fp32, TF32, bf16, fp16 autocast, injected faults) against a CPU fp32 bench, read
from tests/fixtures/cuda-h100/, scored twice: with the tensors they saved, and on their statistics
alone (the tensor files left out), as a statistics-only device recording would be judged.
``--device-set-only`` runs just that (about a minute);
``--no-device-set`` leaves it out.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tabulate import tabulate  # noqa: E402

from accuracy import report  # noqa: E402
from accuracy.runner import run_scenario  # noqa: E402
from accuracy.scenarios import HELD_OUT, holdout, quick, scenarios, with_defaults  # noqa: E402


def xray_version(root: Path) -> str:
    """The measured checkout: its folder and git commit (+ "dirty" with uncommitted changes)."""
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "xray"], capture_output=True,
                               text=True).stdout.strip()
        return f"{root} @ {head}{' + uncommitted changes' if dirty else ''}"
    except (OSError, subprocess.CalledProcessError):
        return str(root)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="every other scenario of each class (about half the time)")
    ap.add_argument("--only", metavar="REGEX", help="run the scenarios whose name matches (e.g. 'backward|noise/')")
    ap.add_argument("--csv", type=Path, help="write one row per scenario (pandas-readable)")
    ap.add_argument("--json", type=Path, help="write the headline figures (tools/bench.py reads them)")
    ap.add_argument("--holdout", type=int, choices=sorted(HELD_OUT), metavar="SET",
                    help="a held-out set instead: 1 (Mistral, ResNet), 2 (Gemma, ConvNeXt), "
                         "3 (Mixtral MoE, MobileNetV2), 4 (Phi, EfficientNet), 5 (Whisper, Swin), 6 (BLOOM, RegNet), "
                         "7 (DeBERTa, SegFormer), 8 (OPT, BiT: training steps), 9 (Mamba, MobileViT), "
                         "10 (Falcon, Wav2Vec2), 11 (Gemma 2, LeViT), 12 (OLMo 2, ConvNeXt V2); see accuracy/scenarios.py")
    ap.add_argument("--defaults", action="store_true",
                    help="record the chosen trace scenarios (noise and injected faults) with the recorder's defaults, "
                         "X_DEDUP=1 and X_DUMP_NUM=5, as users record; their classes get '/defaults'")
    ap.add_argument("--list", action="store_true", help="list the scenarios and exit")
    ap.add_argument("--no-device-set", action="store_true", help="leave out the real CPU-vs-H100 set")
    ap.add_argument("--device-set-only", action="store_true", help="run only the real CPU-vs-H100 set")
    ap.add_argument("-v", "--verbose", action="store_true", help="one line per scenario as it runs")
    args = ap.parse_args(argv)
    chosen = holdout(args.holdout) if args.holdout else scenarios()
    chosen = quick(chosen) if args.quick else chosen
    if args.defaults:
        chosen = [with_defaults(s) for s in chosen]
    if args.only:
        chosen = [s for s in chosen if re.search(args.only, s.name)]
    if args.list:
        for s in chosen:
            print(f"{s.name:34s} {s.dump:11s} {'data' if s.data else 'stats'}  {s.describe()}")
        return 0
    warnings.simplefilter("ignore")
    import xray

    if args.device_set_only:
        t = {"device_set": _device_set()}
        if args.json:
            args.json.write_text(json.dumps(t, indent=1))
        return 0
    started = time.perf_counter()
    outcomes = []
    for i, s in enumerate(chosen):
        o = run_scenario(s)
        outcomes.append(o)
        if args.verbose:
            fd = (o.summary or {}).get("first_divergence") or {}
            verdict = ("crash" if o.crash else "harness error" if o.harness_error else
                       f"fail rows {report.fail_rows(o)}" if s.noise_only else
                       "exact" if o.exact else "module" if o.right_module else "miss")
            print(f"[{i + 1}/{len(chosen)}] {s.name:34s} {o.seconds:5.1f} s  {verdict:14s} "
                  f"first divergence: {fd.get('op') or fd.get('target_op') or '-'} {o.fd_module or ''}", flush=True)
    wall = time.perf_counter() - started
    fault_rows, noise_rows = report.tables(outcomes)
    print(f"\nxray-compare accuracy ({xray_version(Path(xray.__file__).resolve().parent.parent)}), "
          f"{len(outcomes)} scenarios on {len({s.arch for s in chosen})} architectures")
    print(tabulate(fault_rows, headers=report.FAULT_HEADERS))
    print()
    print(tabulate(noise_rows, headers=report.NOISE_HEADERS))
    for o in outcomes:
        if o.crash or o.harness_error:
            print(f"{'crash' if o.crash else 'harness error'}: {o.scenario.name}: {o.crash or o.harness_error}")
    t = report.totals(outcomes)
    t["seconds"] = round(wall, 1)
    t["classes"] = {row[0]: dict(zip(report.FAULT_HEADERS[1:], row[1:])) for row in fault_rows}
    print(f"\nexact hit {t['exact_pct']:.1f} %, right module {t['right_module_pct']:.1f} % of "
          f"{t['fault_scenarios']} fault scenarios; noise only: {t['noise_fail_rows_pct']:.2f} % false-fail rows, "
          f"{t['noise_scenarios_failing']} of {t['noise_scenarios']} scenarios with a FAIL row; "
          f"{t['crashes']} crashes; wall time {wall:.0f} s")
    if not args.no_device_set:
        t["device_set"] = _device_set()
    if args.csv:
        report.write_csv(outcomes, args.csv)
    if args.json:
        args.json.write_text(json.dumps(t, indent=1))
    return 0


def _device_set() -> dict:
    """Score the real CPU-vs-H100 pairs, with their saved tensors and on statistics alone; print
    the tables, return the totals (the statistics-only ones under "statistics_only")."""
    from accuracy import devices

    with tempfile.TemporaryDirectory(prefix="xray-cuda-h100-") as tmp:
        root = devices.unpack(Path(tmp) / "fixtures")
        t = _score_device_set(devices, root, False)
        t["statistics_only"] = _score_device_set(devices, root, True)
    return t


def _score_device_set(devices, root: Path, statistics: bool) -> dict:
    started = time.perf_counter()
    outcomes = devices.run(root, statistics=statistics)
    print()
    headers = list(devices.HEADERS)
    if statistics:
        headers[0] = "real device set, statistics only"
    print(tabulate(devices.table(outcomes), headers=headers))
    for o in outcomes:
        if o.crash or (o.fault and not o.exact) or (not o.fault and not o.clean):
            print(f"  {o.key}: {'crash ' + o.crash if o.crash else 'missed' if o.fault else 'not clean'} "
                  f"(first divergence: {o.fd_op or '-'} seq {o.fd_target_seq}, {o.fail_rows} FAIL rows)")
    t = devices.totals(outcomes)
    print(f"real device set{', statistics only' if statistics else ''}: exact hit {t['exact_pct']:.1f} % of "
          f"{t['faults']} faults, {t['legit_clean']} of "
          f"{t['legitimate']} legitimate runs clean, {t['legit_fail_rows']} false FAIL rows; "
          f"{time.perf_counter() - started:.0f} s")
    return t


if __name__ == "__main__":
    sys.exit(main())
