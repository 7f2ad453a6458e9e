"""A table's ledger: the result files every run of it has produced, on any machine, kept in the
repository beside docs/results.md, and the table rendered from all of them.

    python ledger.py report --table 6 --ledger ../docs/results/runs --runs RESULT.json ... \
        --opts "--paper 6 --as smollm2-135m=FPT" --note "End to end: ..." --csv T.csv --plots DIR
    python ledger.py render --table 6 --ledger ../docs/results/runs --csv T.csv --plots DIR

``report`` adds the result files (and result folders) it is given to ``LEDGER/tableN/`` (a
result's file name carries its key, so a run is kept once; nothing is ever removed), records the
report's options and notes in ``LEDGER/tableN.json``, and prints the table that ``reservoir report``
makes of every result in the ledger. A run made elsewhere (a GPU machine) arrives as its result
files: ``render`` prints the table again from the ledger alone, with the options the last ``report``
recorded, on a machine that holds none of the runs. A table is never remade whole to add a row:
rows of other settings (more steps, other seeds) are told apart by the settings that differ.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path


def result_files(paths: list[str]) -> list[Path]:
    """The result JSON files among ``paths`` (files as they are; folders searched, as ``reservoir report`` does)."""
    from reservoir.results import load_results

    return [Path(r["path"]) for r in load_results([Path(p) for p in paths if Path(p).exists()])]


def portable(value):
    """``value`` (a result) with each absolute path of the machine that ran it (its checkpoints, data and
    working folders) cut to the file or folder name: the ledger is kept in the repository."""
    if isinstance(value, dict):
        return {k: portable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [portable(v) for v in value]
    if isinstance(value, str) and value.startswith("/") and "\n" not in value and " " not in value:
        return Path(value).name
    return value


def keep(files: list[Path], folder: Path) -> int:
    """Copy ``files`` into ``folder`` under ``TASK/BACKBONE/NAME`` (from each result), machine paths cut
    (:func:`portable`); returns how many were new."""
    new = 0
    for f in files:
        result = json.loads(f.read_text())
        dest = folder / result["task"] / result["backbone"].replace("/", "_") / f.name
        if not dest.exists():
            new += 1
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.tmp")
        tmp.write_text(json.dumps(portable(result), indent=2, sort_keys=True))
        tmp.replace(dest)
    return new


def render(table: int, ledger: Path, csv: str, plots: str, reservoir: str) -> str:
    """The markdown of table ``table`` from every result in its ledger, with its recorded options and notes."""
    settings = json.loads((ledger / f"table{table}.json").read_text())
    command = [
        reservoir,
        "report",
        str(ledger / f"table{table}"),
        *shlex.split(settings["opts"]),
        "--csv",
        csv,
        "--plots",
        plots,
    ]
    made = subprocess.run(command, stdout=subprocess.PIPE, text=True)
    if made.returncode:
        raise SystemExit(made.returncode)
    lines = made.stdout.splitlines()
    notes = [line for note in settings["note"] for line in (note, "")]
    text = "\n".join(lines[:2] + notes + lines[2:]) + "\n"
    ran_on = machines(ledger / f"table{table}")
    text += f"\nRan on: {ran_on}.\n" if ran_on else ""
    return text + (settings["append"] if settings["append"] else "")


def machines(folder: Path) -> str:
    """Which machine (CPU or card) made which of the kept runs: ``MACHINE: BACKBONE (TASK, ...); ...``."""
    made: dict[str, dict[str, set[str]]] = {}
    for f in sorted(folder.rglob("*.json")):
        result = json.loads(f.read_text())
        if result.get("mode") == "baseline":
            continue
        for m in result.get("machines") or ["an unrecorded machine"]:
            made.setdefault(m, {}).setdefault(result["backbone"], set()).add(result["task"])
    return "; ".join(
        f"{m}: " + ", ".join(f"{b} ({', '.join(sorted(ts))})" for b, ts in sorted(by.items()))
        for m, by in made.items()
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("action", choices=("report", "render"))
    parser.add_argument("--table", type=int, required=True)
    parser.add_argument("--ledger", type=Path, required=True, help="the folder of every table's kept results")
    parser.add_argument("--runs", nargs="*", default=[], help="result files or folders to keep (report)")
    parser.add_argument(
        "--opts", default="", help="`reservoir report` options of the table, one string (report)"
    )
    parser.add_argument("--note", action="append", default=[], help="a line under the caption (report)")
    parser.add_argument(
        "--append", type=Path, default=None, help="a markdown file added under the table (report)"
    )
    parser.add_argument("--csv", required=True)
    parser.add_argument("--plots", required=True)
    parser.add_argument("--reservoir", default=str(Path(sys.executable).with_name("reservoir")))
    args = parser.parse_args()
    folder = args.ledger / f"table{args.table}"
    if args.action == "report":
        files = result_files(args.runs)
        if not files:
            raise SystemExit(
                f"table {args.table}: none of the runs given holds a result; run its pipeline first"
            )
        new = keep(files, folder)
        recorded = args.ledger / f"table{args.table}.json"
        earlier = json.loads(recorded.read_text())["note"] if recorded.exists() else []
        settings = {
            "opts": args.opts,
            "note": list(dict.fromkeys(earlier + args.note)),
            "append": args.append.read_text() if args.append else "",
        }
        recorded.write_text(json.dumps(settings, indent=1) + "\n")
        print(f"table {args.table}: {new} new of {len(files)} results kept in {folder}", file=sys.stderr)
    elif not (args.ledger / f"table{args.table}.json").exists():
        raise SystemExit(
            f"table {args.table} has no ledger in {args.ledger}: run its pipeline (make table{args.table}) "
            "once, here or elsewhere, and keep the folder it writes"
        )
    sys.stdout.write(render(args.table, args.ledger, args.csv, args.plots, args.reservoir))


if __name__ == "__main__":
    main()
