"""``xray-diff a.csv b.csv result.csv``: put two devices' generated-test results side by side.

Joins on the test name (the generated suite is the same on both machines), says per test and
per op which device is worse, and lists tests present on one side only.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..console import closed_pipe_is_quiet
from ..dump import csv_cells

if TYPE_CHECKING:
    import pandas as pd

REQUIRED = ["name", "op_name", "is_pass", "max_abs_err", "max_rel_err"]
DIFF_COLUMNS = ["name", "op_name", "dtype", "shape", "present", "a_is_pass", "b_is_pass", "a_max_abs_err",
                "b_max_abs_err", "a_max_rel_err", "b_max_rel_err", "worse", "ratio"]


class DiffInputError(ValueError):
    pass


def read_result(path: str | Path) -> pd.DataFrame:
    """A result CSV written by the xray pytest plugin, validated."""
    import pandas as pd

    from .columns import RESULT_COLUMNS

    p = Path(path)
    try:
        df = pd.read_csv(p, dtype={"name": str, "op_name": str, "dtype": str, "shape": str})
    except FileNotFoundError:
        raise DiffInputError(f"{p}: no such file") from None
    except (IsADirectoryError, PermissionError) as e:
        raise DiffInputError(f"{p}: cannot read it ({e.strerror})") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise DiffInputError(f"{p}: not a readable CSV ({e})") from None
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise DiffInputError(f"{p}: missing columns {missing}; expected a CSV written by "
                             "pytest --detail_compare_path (columns: " + ", ".join(RESULT_COLUMNS[:9]) + ", ...)")
    if df["name"].duplicated().any():
        dup = df.loc[df["name"].duplicated(), "name"].iloc[0]
        raise DiffInputError(f"{p}: test name {dup!r} appears twice")
    df["is_pass"] = df["is_pass"].astype(str).str.lower().eq("true")
    for c in ("max_abs_err", "max_rel_err"):
        df[c] = pd.to_numeric(df[c], errors="coerce")
    return df


def _score(df: pd.DataFrame, side: str) -> pd.Series:
    """Badness for comparing the sides: a failed run or missing value counts as infinitely bad."""
    import numpy as np

    rel = df[f"{side}_max_rel_err"].fillna(np.inf)
    return rel


def diff(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """One row per test name in either file; ``worse`` is a, b, tie, or the side that has it."""
    import numpy as np
    import pandas as pd

    keep = ["name", "op_name", "dtype", "shape", "is_pass", "max_abs_err", "max_rel_err"]
    a = a[[c for c in keep if c in a.columns]]
    b = b[[c for c in keep if c in b.columns]]
    m = a.merge(b, on="name", how="outer", suffixes=("_a", "_b"), indicator=True)
    out = pd.DataFrame({"name": m["name"]})
    for c in ("op_name", "dtype", "shape"):
        ca, cb = f"{c}_a", f"{c}_b"
        if ca in m and cb in m:
            out[c] = m[ca].fillna(m[cb])
        else:
            out[c] = m.get(ca, m.get(cb, ""))
    out["present"] = m["_merge"].map({"both": "both", "left_only": "a only", "right_only": "b only"}).astype(str)
    for side, suf in (("a", "_a"), ("b", "_b")):
        out[f"{side}_is_pass"] = m[f"is_pass{suf}"]
        out[f"{side}_max_abs_err"] = m[f"max_abs_err{suf}"]
        out[f"{side}_max_rel_err"] = m[f"max_rel_err{suf}"]
    sa, sb = _score(out, "a"), _score(out, "b")
    both = out["present"] == "both"
    worse = np.where(sa > sb, "a", np.where(sb > sa, "b", "tie"))
    out["worse"] = np.where(both, worse, out["present"])
    with np.errstate(divide="ignore", invalid="ignore"):
        hi, lo = np.maximum(sa, sb), np.minimum(sa, sb)
        ratio = np.where(hi == lo, 1.0, hi / lo)
    out["ratio"] = np.where(both, ratio, np.nan)
    return out[DIFF_COLUMNS].sort_values("name", kind="stable").reset_index(drop=True)


def per_op(d: pd.DataFrame) -> pd.DataFrame:
    """Per op: tests, failures on each side, worst relative error on each side, and who is worse."""
    import numpy as np
    import pandas as pd

    g = d.groupby("op_name", sort=True)
    s = pd.DataFrame({
        "tests": g.size(),
        "a_fail": g["a_is_pass"].apply(lambda x: int((x == False).sum())),  # noqa: E712 (NaN = absent)
        "b_fail": g["b_is_pass"].apply(lambda x: int((x == False).sum())),  # noqa: E712
        "a_max_rel_err": g["a_max_rel_err"].max(),
        "b_max_rel_err": g["b_max_rel_err"].max(),
        "a_only": g["present"].apply(lambda x: int((x == "a only").sum())),
        "b_only": g["present"].apply(lambda x: int((x == "b only").sum())),
    })
    a, b = s["a_max_rel_err"].fillna(-1), s["b_max_rel_err"].fillna(-1)
    s["worse"] = np.where(a > b, "a", np.where(b > a, "b", "tie"))
    return s.reset_index()


@closed_pipe_is_quiet
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="xray-diff", description="Compare two devices' xray result CSVs by test name.",
                                epilog="example:\n  pytest pytests --device cpu --detail_compare_path=cpu.csv   # machine A\n"
                                       "  pytest pytests --device cuda --detail_compare_path=gpu.csv  # machine B\n"
                                       "  xray-diff cpu.csv gpu.csv diff.csv",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("a", help="result CSV of device A (pytest --detail_compare_path)")
    p.add_argument("b", help="result CSV of device B")
    p.add_argument("result", help="where to write the side-by-side CSV")
    p.add_argument("--top", type=int, default=15, help="how many ops to list in the summary (default 15)")
    args = p.parse_args(argv)
    from ..dump.atomic import atomic_write
    from ..quiet import one_line, quiet_third_party

    quiet_third_party()
    import numpy as np  # pandas: only once a command runs
    from tabulate import tabulate

    try:
        a, b = read_result(args.a), read_result(args.b)
    except DiffInputError as e:
        print(f"xray-diff: error: {one_line(e)}", file=sys.stderr)
        return 2
    d = diff(a, b)
    Path(args.result).parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(args.result, newline="") as f:
        csv_cells.frame(d).to_csv(f, index=False)
    both = d[d["present"] == "both"]
    summary = [
        ["tests in both", len(both)],
        ["a only", int((d["present"] == "a only").sum())],
        ["b only", int((d["present"] == "b only").sum())],
        ["fail on a", int((both["a_is_pass"] == False).sum())],  # noqa: E712
        ["fail on b", int((both["b_is_pass"] == False).sum())],  # noqa: E712
        ["a worse", int((both["worse"] == "a").sum())],
        ["b worse", int((both["worse"] == "b").sum())],
        ["tie", int((both["worse"] == "tie").sum())],
    ]
    print(f"xray-diff: a = {args.a}, b = {args.b}")
    print(tabulate(summary, headers=["by test", "tests"], tablefmt="simple"))
    ops = per_op(d)
    ops["spread"] = (ops[["a_max_rel_err", "b_max_rel_err"]].max(axis=1)
                     / ops[["a_max_rel_err", "b_max_rel_err"]].min(axis=1).replace(0, np.nan)).fillna(0)
    shown = ops.sort_values(["a_fail", "b_fail", "spread"], ascending=False).head(args.top).drop(columns="spread")
    print(f"\nby op, failures and error spread first ({len(shown)} of {len(ops)} ops):")
    print(tabulate(shown, headers="keys", tablefmt="github", showindex=False, floatfmt=".3g"))
    print(f"\nxray-diff: {len(d)} tests -> {args.result}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
