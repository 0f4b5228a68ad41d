"""Inject plausible bugs into a copy of the code that guards the numbers, and show that the fast tests fail on each.

``python tests/mutants.py`` copies the packages and the tests into a temporary folder once, then for each
mutant replaces one exact snippet of one module there, runs that mutant's test files (``-m "not slow" -x``,
one process, on YOSO's pure-PyTorch reference: ``YOSO_KERNELS=0``, so that no copy rebuilds the compiled
kernels) and puts the module back. A mutant is *killed* when its tests fail and *survives* when they pass (or
hang past ``TIMEOUT_S``, which is reported as such).
First the unmutated copy must pass every test file named, or nothing is measured. The table says which test
killed each mutant; exit status 1 if any survives. About 5 minutes for all, on two cores.

``--list`` names the mutants; ``--only NAME ...`` runs those; ``--out FILE`` also writes the table (Markdown).
Not part of CI (too slow for every change); ``tests/test_mutants.py`` checks in the fast tier that every
mutant's snippet still occurs exactly once in its module, so the list cannot rot silently.

The mutants cover masks (padded queries and keys), YOSO's gradients, the encoder's pooling, stopping and
resuming, and the table's rules for pooling runs into cells and comparing them with the paper.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 600  # one mutant's test files; a hang is reported, not counted as killed
COPIED = ("attention_zoo", "lra", "yoso_cuda", "tests", "results", "conftest.py", "pyproject.toml")

ZOO = ("tests/attention_zoo/test_every_attention.py",)
YOSO = ("tests/yoso_cuda/test_attention_backward.py", "tests/attention_zoo/test_yoso.py")
MODEL = ("tests/lra/test_model_and_module.py",)
CALLBACKS = ("tests/lra/test_callbacks.py",)
SIGNALS = ("tests/lra/test_signals.py",)
TRAIN = ("tests/lra/test_train.py",)
TABLE = ("tests/lra/test_table.py",)


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # the module, relative to the repository's root
    bug: str
    original: str  # occurs exactly once in the module
    mutated: str
    tests: tuple[str, ...]


MUTANTS = [
    # Masks.
    Mutant(
        "padded_query_rows_kept",
        "attention_zoo/_checks.py",
        "padded queries keep whatever the core attention gave them instead of zero rows",
        "    return out.masked_fill(~mask[:, None, :, None], 0.0)",
        "    return out",
        ZOO,
    ),
    Mutant(
        "softmax_sees_padded_keys",
        "attention_zoo/softmax.py",
        "softmax attention passes no key mask to SDPA: padded keys take part",
        "attn_mask = None if key_mask is None else key_mask[:, None, None, :]",
        "attn_mask = None",
        ("tests/attention_zoo/test_softmax.py", *ZOO),
    ),
    Mutant(
        "softmax_all_padded_row_unguarded",
        "attention_zoo/softmax.py",
        "a sequence whose every token is padded keeps its all-False key mask (NaN rows in SDPA)",
        "key_mask = None if mask is None else mask | ~mask.any(dim=1, keepdim=True)",
        "key_mask = mask",
        ("tests/attention_zoo/test_softmax.py", *ZOO),
    ),
    Mutant(
        "linear_transformer_sums_padded_keys",
        "attention_zoo/linear_transformer.py",
        "the linear transformer's padded keys add to both sums",
        "            phi_k.masked_fill_(key_padded, 0.0)  # padded keys drop out of both sums",
        "            pass",
        ("tests/attention_zoo/test_linear_transformer.py", *ZOO),
    ),
    Mutant(
        "local_attention_without_own_key",
        "attention_zoo/local.py",
        "local attention's block mask drops the diagonal, so a block of padded keys leaves a row with no key",
        "attn_mask = (real | own).expand(batch, heads, num_blocks, block, block)",
        "attn_mask = real.expand(batch, heads, num_blocks, block, block)",
        ("tests/attention_zoo/test_local.py", *ZOO),
    ),
    Mutant(
        "nystromformer_landmarks_see_padded_keys",
        "attention_zoo/nystromformer.py",
        "the Nystromformer's landmark-to-key kernel ignores the key mask",
        "b = softmax_kernel(q_landmarks, k, mask)  # (b, h, m, n)",
        "b = softmax_kernel(q_landmarks, k)  # (b, h, m, n)",
        ("tests/attention_zoo/test_nystromformer.py", *ZOO),
    ),
    Mutant(
        "yoso_e_keys_unmasked",
        "attention_zoo/yoso.py",
        "YOSO-E's pair mask masks queries only: padded keys get collision weight",
        "pair_mask = (folded_mask[:, :, None] & folded_mask[:, None, :]).float()",
        "pair_mask = folded_mask[:, :, None].float().expand(-1, -1, length)",
        YOSO,
    ),
    # YOSO's gradients.
    Mutant(
        "yoso_grad_v_zero",
        "yoso_cuda/attention.py",
        "lsh_attention's backward returns a zero gradient for the values",
        "return grad_q.to(queries.dtype), grad_k.to(keys.dtype), grad_v.to(values.dtype)",
        "return grad_q.to(queries.dtype), grad_k.to(keys.dtype), torch.zeros_like(values)",
        YOSO,
    ),
    Mutant(
        "yoso_grad_v_not_transposed",
        "yoso_cuda/reference.py",
        "the lower bound's grad V cumulates over queries' buckets, B G, instead of keys', B^T G",
        "grad_key_weights = lsh_cumulation(key_codes, key_mask, query_codes, query_mask, query_weights.float(), hash_bits)",
        "grad_key_weights = lsh_cumulation(query_codes, query_mask, key_codes, key_mask, query_weights.float(), hash_bits)",
        YOSO,
    ),
    Mutant(
        "yoso_lower_bound_scale",
        "yoso_cuda/reference.py",
        "the lower bound's grad Q is scaled by tau instead of tau/2",
        "return (hash_bits / 2) * grad_queries, (hash_bits / 2) * grad_keys, grad_key_weights",
        "return hash_bits * grad_queries, (hash_bits / 2) * grad_keys, grad_key_weights",
        YOSO,
    ),
    Mutant(
        "yoso_exact_grad_k_swapped",
        "yoso_cuda/attention.py",
        "*YOSO's grad K sums queries' keys: the vectors of the pair swapped",
        "grad_k = ops.lsh_collided_gradient(key_codes, mask, keys, values, query_codes, mask, queries, grad, tau, backend)",
        "grad_k = ops.lsh_collided_gradient(key_codes, mask, queries, values, query_codes, mask, keys, grad, tau, backend)",
        YOSO,
    ),
    Mutant(
        "yoso_e_surrogate_scale",
        "attention_zoo/yoso.py",
        "YOSO-E's lower-bound surrogate uses tau E instead of (tau/2) E",
        "surrogate = (grad @ values.transpose(-1, -2)) * weights * (ctx.hash_bits / 2)",
        "surrogate = (grad @ values.transpose(-1, -2)) * weights * ctx.hash_bits",
        YOSO,
    ),
    # Pooling.
    Mutant(
        "encoder_features_not_masked",
        "lra/model.py",
        "the encoder's padded positions keep their features and enter the mean",
        "weights = mask.to(features.dtype)[:, None, :]  # (b, 1, n)",
        "weights = torch.ones_like(mask, dtype=features.dtype)[:, None, :]  # (b, 1, n)",
        MODEL,
    ),
    Mutant(
        "encoder_masked_mean",
        "lra/model.py",
        "the pooled features are the mean over real tokens, not the original code's sum over the padded length",
        "return torch.bmm(weights, features).squeeze(1) / features.shape[1]  # (b, dim)",
        "return torch.bmm(weights, features).squeeze(1) / weights.sum(-1)  # (b, dim)",
        MODEL,
    ),
    # Stopping and resuming.
    Mutant(
        "stop_ignores_metrics_rows",
        "lra/callbacks.py",
        "an interruption stops after a step that writes a metrics row",
        "return evaluates or trainer.global_step % trainer.log_every_n_steps == 0",
        "return evaluates",
        CALLBACKS,
    ),
    Mutant(
        "stop_ignores_evaluations",
        "lra/callbacks.py",
        "an interruption stops after a step that evaluates",
        "return evaluates or trainer.global_step",
        "return False or trainer.global_step",
        CALLBACKS,
    ),
    Mutant(
        "stop_ignores_the_epochs_end",
        "lra/callbacks.py",
        "an interruption stops after an epoch's last batch, whose evaluation is due",
        "loop.batch_progress.is_last_batch or (every",
        "False or (every",
        CALLBACKS,
    ),
    Mutant(
        "stop_at_once",
        "lra/callbacks.py",
        "a first Ctrl+C stops at the end of the step whatever is due",
        "if self.stop_requested and not something_due_after(trainer):",
        "if self.stop_requested:",
        CALLBACKS,
    ),
    Mutant(
        "signals_not_held_over_fork",
        "lra/signals.py",
        "a SIGTERM sent to a child forked a moment before is caught by the inherited handler and lost",
        "signal.pthread_sigmask(signal.SIG_BLOCK, list(_taken))",
        "signal.pthread_sigmask(signal.SIG_BLOCK, [])",
        SIGNALS,
    ),
    Mutant(
        "forked_child_keeps_the_handler",
        "lra/signals.py",
        "a forked pool worker keeps the campaign's handler and outlives the pool's terminate()",
        "signal.signal(number, signal.SIG_DFL if first is None else first)",
        "pass",
        SIGNALS,
    ),
    Mutant(
        "testing_error_overwrites_last",
        "lra/callbacks.py",
        "an error while testing overwrites last.ckpt",
        "if trainer.state.fn == TrainerFn.FITTING and not diverged(pl_module):",
        "if not diverged(pl_module):",
        CALLBACKS,
    ),
    Mutant(
        "resume_any_configuration",
        "lra/train.py",
        "a run resumes a last.ckpt left by another configuration in its folder",
        "if previous is not None and previous.config_hash == record.config_hash and last.is_file():",
        "if previous is not None and last.is_file():",
        TRAIN,
    ),
    Mutant(
        "resume_redraws_the_epoch",
        "lra/datamodule.py",
        "a resumed run draws its interrupted pass's batches from the start again",
        'order.skip = self.resume_from.get(f"{split}_batches", 0) * self.batch_size * world_size',
        "order.skip = 0",
        ("tests/lra/test_datamodule.py",),
    ),
    Mutant(
        "diverged_run_is_a_result",
        "lra/module.py",
        "a run whose loss became non-finite trains to the end and is recorded as finished",
        "if self._first_nonfinite_step is None or (step := int(self._first_nonfinite_step)) < 0:",
        "if True:",
        MODEL,
    ),
    # The table's rules.
    Mutant(
        "listops_split_strict",
        "lra/table.py",
        "a ListOps mean of exactly 28% counts below the split",
        'side = (cells["mean"] >= LISTOPS_SPLIT) == (cells["paper"] >= LISTOPS_SPLIT)',
        'side = (cells["mean"] > LISTOPS_SPLIT) == (cells["paper"] >= LISTOPS_SPLIT)',
        TABLE,
    ),
    Mutant(
        "standard_error_not_over_sqrt_k",
        "lra/table.py",
        "a cell's standard error over seeds is their standard deviation, not std / sqrt(k)",
        'cells["standard_error"] = (cells["std"] / np.sqrt(cells["num_seeds"])).where(',
        'cells["standard_error"] = (cells["std"]).where(',
        TABLE,
    ),
    Mutant(
        "best_without_margin",
        "lra/table.py",
        "the best mean is bold however little it beats the next row by",
        'best = (by_task.cumcount() == 0) & (ranked["mean"] - runner_up["mean"] > BEST_MARGIN * noise)',
        'best = (by_task.cumcount() == 0) & (ranked["mean"] - runner_up["mean"] > 0)',
        TABLE,
    ),
    Mutant(
        "spearman_from_two_rows",
        "lra/table.py",
        "Spearman's rho is given from two rows",
        "    if len(ours) < MIN_RANKED_ROWS:\n        return math.nan",
        "    if len(ours) < 2:\n        return math.nan",
        TABLE,
    ),
    Mutant(
        "seeds_pooled_across_configurations",
        "lra/table.py",
        "runs of different configurations are one run when their seed and status agree",
        'return runs.drop_duplicates(subset=["config_hash", "seed", "status", "finished_at"]).reset_index(drop=True)',
        'return runs.drop_duplicates(subset=["seed", "status", "finished_at"]).reset_index(drop=True)',
        TABLE,
    ),
    Mutant(
        "average_with_missing_tasks",
        "lra/table.py",
        "a row's average is taken over the tasks it has, not only when it has all five",
        'return None if any(c is None for c in cells) else sum(c["mean"] for c in cells) / len(TASKS)',
        "cells = [c for c in cells if c is not None]\n"
        '        return sum(c["mean"] for c in cells) / len(cells) if cells else None',
        TABLE,
    ),
]


def mutate(source: str, mutant: Mutant) -> str:
    found = source.count(mutant.original)
    if found != 1:
        raise SystemExit(f"mutant {mutant.name}: its snippet occurs {found} times in {mutant.path}, not once: update MUTANTS")
    return source.replace(mutant.original, mutant.mutated)


def copy_tree(destination: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", ".pytest_cache")
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, destination / name, ignore=ignore)
        else:
            shutil.copy2(source, destination / name)


def run_tests(copy: Path, tests: tuple[str, ...]) -> tuple[bool, str, float]:
    """(passed, first failure, seconds) of ``tests`` run in ``copy``."""
    env = {**os.environ, "PYTHONPATH": str(copy), "YOSO_KERNELS": "0", "PYTHONDONTWRITEBYTECODE": "1"}
    env.setdefault("OMP_NUM_THREADS", "1")
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", "not slow", *tests]
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=copy, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)  # fmt: skip
    try:
        output, _ = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the tests' own children (a forked pool) too
        process.communicate()
        return False, f"TIMED OUT after {TIMEOUT_S} s (a hang: run it again with --only)", time.perf_counter() - start
    seconds = time.perf_counter() - start
    if process.returncode == 0:
        return True, "", seconds
    failed = re.search(r"^(?:FAILED|ERROR) (\S+)", output, re.M)
    reason = re.search(r"^E\s+(.+)$", output, re.M)
    test = failed.group(1) if failed else f"(no test failed: pytest exited {process.returncode})"
    why = reason.group(1).strip() if reason else output.strip().splitlines()[-1] if output.strip() else ""
    return False, f"{test}: {why[:300]}", seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="name the mutants and exit")
    parser.add_argument("--only", nargs="+", choices=[m.name for m in MUTANTS], metavar="NAME", help="run only these mutants")
    parser.add_argument("--out", type=Path, help="also write the table (Markdown) to this file")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    if args.list:
        for mutant in chosen:
            print(f"{mutant.name:40s} {mutant.path:36s} {mutant.bug}")
        return 0
    sources = {m.path: (ROOT / m.path).read_text() for m in chosen}
    mutated = {m.name: mutate(sources[m.path], m) for m in chosen}  # every snippet checked before anything runs
    rows = ["| mutant | module | bug | killed by | seconds |", "| --- | --- | --- | --- | --- |"]
    survivors = []
    with tempfile.TemporaryDirectory(prefix="lra_mutants_") as folder:
        copy = Path(folder)
        copy_tree(copy)
        tests = tuple(dict.fromkeys(test for m in chosen for test in m.tests))
        passed, failure, seconds = run_tests(copy, tests)
        print(f"unmutated copy: {'the tests pass' if passed else 'FAILS: ' + failure} ({seconds:.0f} s)", flush=True)
        if not passed:
            return 2
        for mutant in chosen:
            target = copy / mutant.path
            target.write_text(mutated[mutant.name])
            try:
                passed, failure, seconds = run_tests(copy, mutant.tests)
            finally:
                target.write_text(sources[mutant.path])
            if passed or failure.startswith("TIMED OUT"):
                survivors.append(mutant.name)
            killed_by = "SURVIVED" if passed else failure.replace("|", "/")
            row = f"| `{mutant.name}` | {mutant.path} | {mutant.bug} | {killed_by} | {seconds:.0f} |"
            rows.append(row)
            print(row, flush=True)
    table = "\n".join(rows)
    if args.out:
        args.out.write_text(table + "\n")
    survived = f"; survived: {', '.join(survivors)}" if survivors else ""
    print(f"\n{len(chosen) - len(survivors)} of {len(chosen)} mutants killed{survived}")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
