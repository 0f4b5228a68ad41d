"""The runs' records as a table beside a paper's: ``python -m lra.table [--rows ROWS] [--paper NAME] [--speed]``.

    python -m lra.table                              # every row with finished runs: outputs/comparison.{md,csv,tex,png}
    python -m lra.table --rows softmax,yoso_32 --speed   # these rows, in this order, with steps/s and peak memory
    python -m lra.table --paper table3               # Table 3 as the YOSO paper prints it: outputs/table3.*
    python -m lra.table --collect                    # commit the finished runs to results/runs/, remake results/*
    python -m lra.table --committed                  # remake the committed tables (COMMITTED_TABLES) from results/runs/
    python -m lra.table --committed --protocol spt_short --name spt   # results/spt.* alone from the committed records

The records become a table in four stages, a module each, each rule beside the code that applies it:
:mod:`~lra.table.records` finds and reads the run records (and commits them: ``--collect``),
:mod:`~lra.table.cells` pools a configuration's seeds into cells and compares them with the paper,
:mod:`~lra.table.sections` puts the cells into a section per protocol and setting, strongest evidence first, and
:mod:`~lra.table.writers` writes the table as Markdown, CSV, LaTeX and a figure.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .. import config
from ..paper import TABLE3, TABLES
from ..results import RESULTS_FILE
from . import curves
from .cells import LISTOPS_SPLIT, TASKS, agreement, cell_frame, difference_error, frame, on_papers_side, spearman
from .curves import find_curves
from .records import check_hashes, collect, find_record_files, find_records, run_file_name
from .sections import ALL_ROWS, PAPER_ROWS, Section, Table, build, declared_protocol, evidence_first, paper_setup
from .writers import LOADED, agreement_frame, cells_frame, figure, latex, markdown, write_all

__all__ = [
    "ALL_ROWS",
    "COMMITTED_TABLES",
    "LISTOPS_SPLIT",
    "LOADED",
    "PAPER_ROWS",
    "TASKS",
    "Section",
    "Table",
    "agreement",
    "agreement_frame",
    "build",
    "cell_frame",
    "cells_frame",
    "check_hashes",
    "curves",
    "collect",
    "declared_protocol",
    "difference_error",
    "evidence_first",
    "figure",
    "find_curves",
    "find_record_files",
    "find_records",
    "frame",
    "latex",
    "main",
    "markdown",
    "on_papers_side",
    "paper_setup",
    "parse_rows",
    "parser",
    "run_file_name",
    "spearman",
    "write_all",
]


# The tables committed in results/, as their command lines. `--collect` and `--committed` without a choice of table
# remake them all, so that no committed table disagrees with the committed records (tests/lra/test_table.py checks it).
COMMITTED_TABLES = (
    (),  # comparison.*: every row with runs, beside Table 3
    ("--paper", "table3"),
    ("--paper", "table3", "--protocol", "spt_short", "--name", "spt"),  # self-pretraining (docs/self-pretraining.md)
    ("--paper", "lra_table1"),
)
TABLE_CHOICES = ("paper", "rows", "protocol", "name", "speed")  # the options that choose one table


def parse_rows(text: str) -> str | tuple[str, ...]:
    """``--rows``: ``paper``, ``all`` or a comma-separated list of rows (presets or attentions), in the order wanted."""
    if text in (PAPER_ROWS, ALL_ROWS):
        return text
    rows = tuple(row.strip() for row in text.split(",") if row.strip())
    if not rows:
        raise argparse.ArgumentTypeError(f"expected {PAPER_ROWS}, {ALL_ROWS} or rows separated by commas, got {text!r}")
    return rows


def parser() -> argparse.ArgumentParser:
    """The command line of :func:`main`."""
    output_dir = config.output_dir()
    line = argparse.ArgumentParser(prog="python -m lra.table", description=__doc__.split("\n\n")[0])
    line.add_argument(
        "--runs",
        type=Path,
        nargs="*",
        default=[output_dir],
        help="folders searched for results.json (default: outputs/ or $LRA_OUTPUT_DIR)",
    )
    line.add_argument(
        "--results",
        type=Path,
        default=Path("results"),
        help="the committed results; their runs/ subfolder holds the committed run records",
    )
    line.add_argument(
        "--out", type=Path, default=output_dir, help="where the user's table goes (default: outputs/ or $LRA_OUTPUT_DIR)"
    )
    line.add_argument(
        "--collect",
        action="store_true",
        help="copy finished runs into RESULTS/runs/, then remake every committed table (and NAME.* if a table is "
        "chosen) from RESULTS/runs/",
    )
    line.add_argument(
        "--committed",
        action="store_true",
        help="write into RESULTS/ from RESULTS/runs/ alone, instead of the user's table: every committed table, or NAME.* "
        "if a table is chosen (--paper, --rows, --protocol, --name, --speed)",
    )
    line.add_argument(
        "--paper",
        choices=sorted(TABLES),
        help="the published table whose numbers stand beside the cells: table3 (the YOSO paper's Table 3, the default) or "
        "lra_table1 (the LRA paper's Table 1); given alone, the table as the paper prints it (its rows only): NAME.*",
    )
    line.add_argument(
        "--rows",
        type=parse_rows,
        help="which rows: 'all' (every attention with finished runs, the paper's rows first in its order, then the others "
        "by name: comparison.*, the default without --paper), 'paper' (the published table's rows: the default with --paper) "
        "or rows separated by commas, in the order wanted (e.g. softmax,yoso_32,my_attention)",
    )
    line.add_argument("--speed", action="store_true", help="also show each cell's training steps per second and peak memory (MB)")
    line.add_argument(
        "--protocol", nargs="+", metavar="NAME", help="only runs of these protocols (e.g. spt_short); default: every run"
    )
    line.add_argument(
        "--name", help="the tables' file name, NAME.{md,csv,tex,png} (default: comparison, or the --paper's name for its rows)"
    )
    return line


def main(argv: list[str] | None = None) -> None:
    """``python -m lra.table``: read every ``results.json`` under the output folder (``outputs/``,
    ``$LRA_OUTPUT_DIR``) and the run records committed under ``results/runs/``, and write ``<name>.{md,csv,tex,png}``
    and ``<name>_agreement.csv`` into the output folder: the user's table, beside the user's runs; nothing is written
    into ``results/`` unless asked.

    Which rows: by default (``--rows all``) the comparison table, ``comparison.*``: a row per attention (registered
    name or preset, as ``attention=`` named it) with finished runs, Table 3's rows first in its order, then the others
    by name, so an attention a user just added and trained is a row beside the paper's. ``--rows a,b,c`` picks rows
    and orders them. ``--paper NAME`` alone writes a published table (:data:`lra.paper.TABLES`) as its paper prints
    it, its rows only, in its order and labels: ``table3``, Table 3 of the YOSO paper, and ``lra_table1``, Table 1 of
    the LRA paper; with ``--rows`` it names whose numbers stand beside the cells (Table 3's by default). The rules are
    the same for every table ("the paper" is the table's).

    ``--committed`` writes into ``results/`` from the committed records alone, so that a committed table never holds a
    run that is not committed beside it: the table chosen, or without a choice every committed table
    (:data:`COMMITTED_TABLES`). ``--collect`` copies the finished local runs into ``results/runs/``
    (:func:`~lra.table.records.collect`), then remakes every committed table, and the one chosen if it is not among
    them. ``--speed`` adds each cell's training steps per second and peak memory, from the records.
    """
    line = parser()
    args = line.parse_args(argv)
    runs_dir = args.results / "runs"
    chosen = choice(args)
    every_committed = [choice(line.parse_args(list(arguments))) for arguments in COMMITTED_TABLES]
    if args.collect:
        tables = every_committed + [chosen] * (chosen not in every_committed)
    elif args.committed and not any(getattr(args, option) for option in TABLE_CHOICES):
        tables = every_committed
    else:
        tables = [chosen]
    if args.collect:
        found = find_record_files(args.runs)
        check_hashes(found)
        new = collect(found, runs_dir)
        print(f"{new} new run records in {runs_dir}")
    if args.collect or args.committed:
        found = find_record_files([runs_dir])
        source, out = f"the run records committed in `{runs_dir}/`", args.results
    else:
        found = find_record_files([*args.runs, runs_dir])
        source, out = f"the runs in `{', '.join(map(str, args.runs))}` and `{runs_dir}/`", args.out
    local = {record.config_hash for path, record in found if path.name == RESULTS_FILE}  # the user's own runs: first
    records, curves_found = [record for _, record in found], find_curves(found)
    protocols = {(record.protocol or {}).get("name") for record in records}
    for only in tables:
        if only is not chosen and only["protocols"] and not protocols & set(only["protocols"]):
            print(f"note: no committed runs of protocol {', '.join(only['protocols'])}: {only['name']}.* not written")
            continue
        for path in write_all(records, out, source, curves=curves_found, local=local, **only):
            print(f"wrote {path}")


def choice(args: argparse.Namespace) -> dict[str, Any]:
    """The table that ``args`` chose, as :func:`~lra.table.writers.write_all`'s arguments."""
    return {
        "name": args.name,
        "protocols": args.protocol,
        "published": TABLES[args.paper or TABLE3.name],
        "rows": args.rows or (PAPER_ROWS if args.paper else ALL_ROWS),
        "speed": args.speed,
    }
