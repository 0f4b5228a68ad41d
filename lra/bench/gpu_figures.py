"""Each step's key figures in the summary of ``python -m lra.bench gpu``, read from what the step wrote: the check's
JSON, pytest's JUnit XML, compute-sanitizer's exit status, the benchmarks' rows (:mod:`lra.rows`) and the training
runs' records. A step's log is for reading, never parsed.
"""

from __future__ import annotations

import json
import shutil
from datetime import datetime
from pathlib import Path
from xml.etree import ElementTree

from lra.bench.gpu_record import SUMMARY
from lra.campaign import MPS_CONTROL
from lra.paper import TABLES
from lra.results import RunRecord
from lra.rows import read_rows, write_rows

STEP_ROWS = "table3"  # the step's attentions (lra.bench step --attentions): the twelve rows of the YOSO paper's Table 3
# Another path to a row's attention (the same results), timed right after its row and compared with it, not in the sum.
STEP_CANDIDATES = {"softmax_unpadded": "softmax", "yoso_e_flex": "yoso_e"}
STEP_SUM_TARGET_MS = 60.0  # issue 56: the twelve rows' compiled ListOps steps together within this on an H100
STEP_TARGET_MS = 3.0  # issue 38: the none ListOps step (and an evaluation batch) within this on an H100/H200
SANITIZER_ERRORS = 86  # the exit status compute-sanitizer is given for an error it reports (pytest's own are 0-5)
# What each step writes, relative to --out: a file older than the step is an earlier run's, not its result.
OUTPUTS = {
    "check": f"{SUMMARY}/check.json",
    **{name: f"{SUMMARY}/{name}.xml" for name in ("tests", "memcheck", "racecheck")},
    **{name: f"{name}_cuda.csv" for name in ("kernels", "efficiency", "step", "authors")},
}
TRAIN_FIELDS = [
    "attention_preset",
    "attention",
    "status",
    "steps",
    "test_acc",
    "best_val_acc",
    "wall_time_s",
    "peak_memory_mb",
    "device",
    "error",
]


def figures_for(name: str, out: Path, since: float, exit_status: int | None, train_dir: Path) -> tuple[list[str], bool]:
    """The key figures of the step ``name`` started at ``since`` (``time.time()``), which ended with ``exit_status``
    (None: stopped at its time limit), and whether its outputs hold up beyond that status."""
    if name in ("memcheck", "racecheck"):
        sanitized = [sanitizer_figure(name, exit_status)]
        return sanitized + (pytest_figures(out / OUTPUTS[name]) if not stale(out / OUTPUTS[name], since) else []), True
    if name in OUTPUTS and (note := stale(out / OUTPUTS[name], since)):
        return [note], False
    if name == "train":
        return train_figures(train_dir, out)
    if name == "cells":
        return cells_figures(out, since)
    if name == "step":
        return step_figures(out, since)
    if name == "authors":
        return authors_figures(out)
    read = {"check": check_figures, "tests": pytest_figures, "kernels": kernels_figures, "efficiency": efficiency_figures}
    return read[name](out / OUTPUTS[name]), True


def stale(path: Path, since: float | None) -> str | None:
    """Why ``path`` is not the output of a step started at ``since`` (``time.time()``): missing, or older."""
    if not path.exists():
        return f"wrote no {path.name}"
    if since is not None and path.stat().st_mtime < since:
        return f"wrote no {path.name} (the one there is an earlier run's, left as it was)"
    return None


def check_figures(path: Path) -> list[str]:
    """How many ops passed; each CUDA op's verdict and every failure; what each kernel library is."""
    check = json.loads(path.read_text())
    verdicts = check["verdicts"]
    figures = [f"{sum(v['passed'] for v in verdicts)} PASS, {sum(not v['passed'] for v in verdicts)} FAIL"]
    figures += [" ".join(v["line"].split()) for v in verdicts if v["device"] == "cuda" or not v["passed"]]
    return figures + list(check["libraries"].values())


def kernels_unusable(out: Path, record: dict, here: str) -> str | None:
    """Why the CUDA kernel steps have nothing to run: the record's check, failed on this machine and commit (``here``),
    found the CUDA kernels unbuilt or unsafe. None where they are usable or were not checked here."""
    check, path = record["steps"].get("check"), out / OUTPUTS["check"]
    if not check or check["status"] == "passed" or check.get("ran_on") != here or not path.is_file():
        return None
    found = json.loads(path.read_text())
    if found["cuda_usable"]:
        return None
    return (
        f"the CUDA kernels did not build or are unsafe ({found['libraries']['cuda']}; check, {SUMMARY}/check.log): "
        "nothing to run until a check passes (--steps check)"
    )


def pytest_figures(path: Path) -> list[str]:
    """pytest's counts and the tests that failed, from its JUnit XML."""
    suite = ElementTree.parse(path).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    failures, errors, skipped = (int(suite.get(count, 0)) for count in ("failures", "errors", "skipped"))
    passed = int(suite.get("tests", 0)) - failures - errors - skipped
    failed = [
        f"{case.get('classname')}.{case.get('name')}"
        for case in suite.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    took = float(suite.get("time", 0))
    summary = f"pytest: {passed} passed, {failures} failed, {errors} errors, {skipped} skipped in {took:.1f} s"
    return [summary] + [f"failed: {name}" for name in failed[:20]]


def sanitizer_figure(tool: str, exit_status: int | None) -> str:
    """What compute-sanitizer's exit status says: errors it reported, or the tests' own status."""
    if exit_status is None:
        return f"compute-sanitizer {tool}: stopped at the step's time limit, before its summary"
    if exit_status == SANITIZER_ERRORS:
        return f"compute-sanitizer {tool}: errors reported (exit status {SANITIZER_ERRORS}), the first ones in the log"
    return f"compute-sanitizer {tool}: no errors reported" + (f"; the tests exited with {exit_status}" if exit_status else "")


def kernels_figures(path: Path) -> list[str]:
    """Per dtype and head dim, at the longest length YOSO-32 ran: its forward+backward time and the fastest softmax's."""
    rows = read_rows(path)
    figures = []
    for dtype, head_dim in sorted({(r["dtype"], r["head_dim"]) for r in rows}):
        timed = [
            r
            for r in rows
            if (r["dtype"], r["head_dim"]) == (dtype, head_dim)
            and r["pass"] == "forward+backward"
            and r["time_ms"] not in ("", "nan")
        ]
        yoso = [r for r in timed if r["method"] == "yoso_32"]
        if not yoso:
            figures.append(f"{dtype} d={head_dim}: yoso_32 did not run")
            continue
        longest = max(yoso, key=lambda r: int(r["seq_len"]))
        softmax = [r for r in timed if r["method"].startswith("softmax") and r["seq_len"] == longest["seq_len"]]
        best = min(softmax, key=lambda r: float(r["time_ms"]), default=None)
        against = f"{best['method']} {float(best['time_ms']):.2f} ms" if best else "no softmax backend ran"
        figures.append(
            f"{dtype} d={head_dim} n={longest['seq_len']} forward+backward: yoso_32 {float(longest['time_ms']):.2f} ms, {against}"
        )
    failed = sum(bool(r["error"]) for r in rows)
    return (
        figures
        + official_figures(rows)
        + [f"{len(rows)} rows, {failed} with an error (out of memory or a backend refusing the inputs)"]
    )


def official_figures(rows: list[dict[str, str]]) -> list[str]:
    """Per shape, forward+backward: official mlpen/YOSO's time / ours (issue 39's target: >= 5), where both ran."""
    figures = []
    for method in sorted({r["method"] for r in rows if r["method"].startswith("yoso_32/official")}):
        ratios = []
        for theirs in [r for r in rows if r["method"] == method and r["pass"] == "forward+backward"]:
            shape = (theirs["dtype"], theirs["head_dim"], theirs["seq_len"])
            label = f"{shape[0]} d={shape[1]} n={shape[2]}"
            ours = next(
                (
                    r
                    for r in rows
                    if r["method"] == "yoso_32"
                    and r["pass"] == "forward+backward"
                    and (r["dtype"], r["head_dim"], r["seq_len"]) == shape
                ),
                None,
            )
            if theirs["error"] or theirs["time_ms"] in ("", "nan"):
                figures.append(f"{label} forward+backward: {method} failed: {theirs['error'][:160]}")
            elif ours is None or ours["error"] or ours["time_ms"] in ("", "nan"):
                figures.append(f"{label} forward+backward: {method} {float(theirs['time_ms']):.2f} ms, yoso_32 did not run")
            else:
                ratio = float(theirs["time_ms"]) / float(ours["time_ms"])
                ratios.append(ratio)
                figures.append(
                    f"{label} forward+backward: {method} {float(theirs['time_ms']):.2f} ms / yoso_32 "
                    f"{float(ours['time_ms']):.2f} ms = {ratio:.1f}x"
                )
        commit = next((r.get("official_commit") for r in rows if r["method"] == method and r.get("official_commit")), "?")
        verdict = f"{'met' if ratios and min(ratios) >= 5 else 'NOT met'}" + (
            f" (lowest {min(ratios):.1f}x)" if ratios else " (no ratio)"
        )
        figures.append(f"{method} (mlpen/YOSO {commit[:12]}) / yoso_32 >= 5x at every shape: {verdict}")
    return figures


def efficiency_figures(path: Path) -> list[str]:
    rows = read_rows(path)
    if not rows:
        return ["no rows"]
    longest = max(int(r["seq_len"]) for r in rows)
    figures = [
        f"{r['attention']} n={longest}: {float(r['time_ms']):.3f} ms and {float(r['memory_mb']):.1f} MB per instance "
        f"(batch {r['batch']})"
        if r["status"] == "ok"
        else f"{r['attention']} n={longest}: {r['status']}"
        for r in rows
        if int(r["seq_len"]) == longest
    ]
    statuses = sorted({r["status"] for r in rows})
    return figures + ["cells: " + ", ".join(f"{sum(r['status'] == s for r in rows)} {s}" for s in statuses)]


def train_figures(train_dir: Path, out: Path) -> tuple[list[str], bool]:
    """Every preset's results.json into train_presets_cuda.csv; figures and whether every preset finished."""
    from lra import config  # the presets: Hydra's config, composed only for this step

    rows = []
    for preset in config.attention_rows():
        found = sorted(train_dir.glob(f"*/{preset}/**/results.json"))
        record = RunRecord.read(found[-1]) if found else RunRecord(status="missing")
        values = {key: getattr(record, key) for key in TRAIN_FIELDS[1:]}
        rows.append({"attention_preset": preset, **{key: "" if value is None else value for key, value in values.items()}})
    write_rows(rows, out / "train_presets_cuda.csv", TRAIN_FIELDS)
    figures = [
        f"{r['attention_preset']}: {r['status']}, {r['steps']} steps, test acc {r['test_acc']}, {r['wall_time_s']} s, "
        f"{r['peak_memory_mb']} MB" + (f", error: {str(r['error'])[:200]}" if r["error"] else "")
        for r in rows
    ]
    return figures, all(r["status"] == "finished" for r in rows)


def cells_figures(out: Path, since: float | None = None) -> tuple[list[str], bool]:
    """Cells per hour at each K, without and with MPS, from the newest cells_per_hour_cuda*.csv; whether every copy
    finished."""
    curves = sorted(out.glob("cells_per_hour_cuda*.csv"), key=lambda path: path.stat().st_mtime)
    rows = read_rows(curves[-1]) if curves and not stale(curves[-1], since) else []
    figures = [
        f"K={r['parallel']}, MPS {r.get('mps') or 'off'}: {r['cells_per_hour']} cells of {r['paper_steps']} steps per hour "
        f"(x{r['speedup']}), {r['finished']} finished in {r['wall_s']} s"
        for r in rows
    ]
    if rows and not any(r.get("mps") == "on" for r in rows):
        why = "no measurement with it was written" if shutil.which(MPS_CONTROL) else f"{MPS_CONTROL} is not on PATH"
        figures.append(f"without MPS only: {why}")
    return figures or ["no curve written"], bool(rows) and all(r["finished"] == f"{r['parallel']}/{r['parallel']}" for r in rows)


def step_figures(out: Path, since: float | None = None) -> tuple[list[str], bool]:
    """The ListOps rows of the step: train and evaluation ms, device busy ms, kernels; whether none has a row.
    With ``since`` (``time.time()`` at the step's start), only the rows measured from then on: the file keeps earlier
    runs' cells (another GPU's, a row this run did not reach), which are not this run's figures."""
    rows = [r for r in read_rows(out / "step_cuda.csv") if r["task"] == "listops" and r.get("data_loading") == "False"]
    rows = [r for r in rows if r["attention"] in [*TABLES[STEP_ROWS].presets, *STEP_CANDIDATES] and r["seq_len"] == "2048"]
    figures = []
    if since is not None:
        earlier = [r for r in rows if not measured_since(r, since)]
        rows = [r for r in rows if measured_since(r, since)]
        if earlier:
            figures.append(f"{len(earlier)} rows of step_cuda.csv are earlier runs' (not shown)")
    figures += [step_line(r, rows) for r in rows]
    floor = [r for r in rows if r["attention"] == "none" and r["status"] == "ok"]
    if floor:
        best = min(floor, key=lambda r: float(r["step_ms"]))
        met = float(best["step_ms"]) <= STEP_TARGET_MS and float(best.get("eval_ms") or "inf") <= STEP_TARGET_MS
        figures.append(
            f"none step <= {STEP_TARGET_MS} ms: {'met' if met else 'NOT met'} (best: {best['step_ms']} ms step, "
            f"{best.get('eval_ms')} ms evaluation, {'compiled' if best['compiled'] == 'True' else 'eager'}; back to back, as "
            f"lra.train's loop: {best.get('loop_ms') or '?'} and {best.get('eval_loop_ms') or '?'} ms); "
            "profiles in step_cuda_profile/"
        )
    compiled = {
        r["attention"]: float(r["step_ms"])
        for r in rows
        if r["compiled"] == "True" and r["status"] == "ok" and r["attention"] in TABLES[STEP_ROWS].presets
    }
    if len(compiled) == len(TABLES[STEP_ROWS].presets):
        total = sum(compiled.values())
        figures.append(
            f"the twelve rows' compiled steps sum to {total:.1f} ms (target {STEP_SUM_TARGET_MS:g} ms on an H100: "
            f"{'met' if total <= STEP_SUM_TARGET_MS else 'NOT met'}); slowest {max(compiled, key=compiled.get)} "
            f"{max(compiled.values()):.2f} ms"
        )
    return figures, bool(floor)


def step_line(row: dict[str, str], rows: list[dict[str, str]]) -> str:
    """One row of the step: its times, and a candidate's step as a ratio to its row's of the same variant."""
    variant = variant_of(row)
    if row["status"] != "ok":
        return f"{row['attention']} {variant}: {row['status']} {row['error'][:200]}"
    of = STEP_CANDIDATES.get(row["attention"])
    theirs = [r for r in rows if r["attention"] == of and variant_of(r) == variant and r["status"] == "ok"]
    against = f", {float(row['step_ms']) / float(theirs[0]['step_ms']):.2f}x {of}'s" if theirs else ""
    return (
        f"{row['attention']} {variant}: step {row['step_ms']} ms{against} ({row.get('loop_ms') or '?'} back to back), "
        f"evaluation batch {row.get('eval_ms') or '?'} ms ({row.get('eval_loop_ms') or '?'} back to back), device busy "
        f"{row.get('device_ms') or '?'} ms in {row.get('kernels') or '?'} kernels per step"
    )


def variant_of(row: dict[str, str]) -> str:
    return f"compiled {row.get('compile_mode') or 'default'}" if row["compiled"] == "True" else "eager"


def measured_since(row: dict[str, str], since: float) -> bool:
    """Whether a row of the step's CSV was measured at ``since`` (``time.time()``) or later (a row without the time
    is an earlier run's)."""
    return bool(row.get("measured_at")) and datetime.fromisoformat(row["measured_at"]).timestamp() >= int(since)


def authors_figures(out: Path) -> tuple[list[str], bool]:
    """Each row beside the authors' code: both steps and theirs / ours; whether one was measured."""
    rows = read_rows(out / OUTPUTS["authors"])
    figures = [
        f"{r['row']}: theirs {r['their_s']} s, ours {r['our_s']} s a step, theirs / ours {r['ratio']} ({r['device']} {r['date']})"
        if r["status"] == "ok"
        else f"{r['row']}: {r['status']} {r['error'][:200]}"
        for r in rows
    ]
    return figures, any(r["status"] == "ok" for r in rows)
