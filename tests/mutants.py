"""Inject plausible bugs into a copy of the code that guards the numbers, and show that the tests fail on each.

Each mutant replaces one exact snippet of one file (a snippet that no longer occurs exactly once stops the
run before anything runs, so a mutant cannot rot into testing nothing) and runs its test files
(``pytest -x``, one process). It is *killed* when they fail and *survives* when they pass (or hang past its
kind's time limit, which is reported as such). Two kinds, which differ in how the mutated file reaches the
tests (:data:`KINDS`):

* ``python``: a module of ``attention_zoo``, ``lra`` or ``yoso_cuda`` (or a file of :data:`COPIED` that tests read,
  such as the README's quoted numbers). The packages and the tests are copied
  into a temporary folder once; each mutant replaces its module there, runs its fast tests (``-m "not
  slow"``) on YOSO's pure-PyTorch reference (``YOSO_KERNELS=0``, so that no copy rebuilds the compiled
  kernels) and puts the module back. The masks, YOSO's gradients, the encoder's pooling, stopping and
  resuming, and the table's rules. About 5 minutes for all, on two cores.
* ``cuda``: ``yoso_cuda/csrc/cuda/yoso_cuda.cu``. The mutated copy is written to a folder of its own under
  torch's extensions folder (``yoso_mutants/<name>/``) and ``YOSO_EMULATOR_SOURCE`` points the repository's
  ``tests/yoso_cuda/test_emulated_cuda.py`` at it (``-k "not sanitized_build"``), so a second run reuses the
  emulator's build of each mutant; they run with the compiled CPU library, which holds the ops' schemas. A
  mutant that passes runs again on the sanitized build (AddressSanitizer and UndefinedBehaviorSanitizer).
  Barriers, warp collectives, bucket indexing and the cumulations' sums. On the 2-core development VM
  (2026-11-28, ``--only inclusive_bucket_scan``): the unmutated run 266 s, the mutant 120 s with its first
  build, 10 s with the build reused.

Before the first mutant of each pass (a kind's tests, or its sanitized run), the unmutated sources must pass
the tests of every chosen mutant of that kind, or nothing is measured (exit status 2). The table says which
test killed each mutant; exit status 1 if any survives.

``--list`` names the mutants; ``--only NAME ...`` and ``--kind python|cuda`` choose some; ``--out FILE`` also
writes the table (Markdown). Not part of CI (too slow for every change); ``tests/test_mutants.py`` checks in
the fast tier that every mutant's snippet still occurs exactly once in its file.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from yoso_cuda.build import extensions_root
from yoso_cuda.emulator import sanitizer_preload

ROOT = Path(__file__).resolve().parents[1]
COPIED = (
    "attention_zoo",
    "lra",
    "yoso_cuda",
    "tests",
    "results",
    "conftest.py",
    "pyproject.toml",
    "README.md",  # the table's tests check the numbers it quotes
)


@dataclass(frozen=True)
class Kind:
    """How a kind of mutant reaches its tests, and how they run."""

    environment: tuple[tuple[str, str], ...]  # set for every run of the tests
    pytest_args: tuple[str, ...]
    # "": the mutated module replaces the original in the temporary copy, where the tests run. Otherwise the
    # mutated file is written to a folder kept between runs and this variable names it to the repository's tests,
    # which run in place: the builds made from it (keyed by its path) are reused by the next run.
    source_variable: str
    sanitized_pass: bool  # a mutant that passes its tests runs them again on the sanitized build
    timeout_s: int  # one run of a mutant's tests (with its build); a hang is reported, not counted as killed


KINDS = {
    "python": Kind(
        environment=(("YOSO_KERNELS", "0"),),
        pytest_args=("-m", "not slow"),
        source_variable="",
        sanitized_pass=False,
        timeout_s=600,
    ),
    "cuda": Kind(
        environment=(),  # the emulator needs the compiled CPU library: never YOSO_KERNELS=0
        pytest_args=("-k", "not sanitized_build"),
        source_variable="YOSO_EMULATOR_SOURCE",
        sanitized_pass=True,
        timeout_s=1800,
    ),
}


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # the mutated file, relative to the repository's root
    bug: str
    original: str  # occurs exactly once in the file
    mutated: str
    tests: tuple[str, ...]
    kind: str = "python"  # a key of KINDS


ZOO = ("tests/attention_zoo/test_every_attention.py",)
YOSO = ("tests/yoso_cuda/test_attention_backward.py", "tests/attention_zoo/test_yoso.py")
MODEL = ("tests/lra/test_model_and_module.py",)
CALLBACKS = ("tests/lra/test_callbacks.py",)
SIGNALS = ("tests/lra/test_signals.py",)
TRAIN = ("tests/lra/test_train.py",)
TABLE = ("tests/lra/test_table.py",)
CARRIED = ("tests/lra/test_carried_state.py",)
EVALUATE = ("tests/lra/test_evaluate.py",)


def cuda_mutant(name: str, bug: str, original: str, mutated: str) -> Mutant:
    """A bug in the CUDA kernels, caught by the emulated tests or their sanitized run."""
    return Mutant(
        name, "yoso_cuda/csrc/cuda/yoso_cuda.cu", bug, original, mutated, ("tests/yoso_cuda/test_emulated_cuda.py",), "cuda"
    )


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
        "padded_inputs_reach_the_attention",
        "attention_zoo/_checks.py",
        "q, k and v reach the core attention with whatever their padded positions hold (a NaN there leaks)",
        "    return q.masked_fill(padded, 0.0), k.masked_fill(padded, 0.0), v.masked_fill(padded, 0.0)",
        "    return q, k, v",
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
        "nystromformer_pinv_backward_under_autocast",
        "attention_zoo/nystromformer.py",
        "the pseudo-inverse's written-out backward runs under the autocast a compiled step traces it in",
        "with torch.autocast(grad.device.type, enabled=False):",
        "if True:",
        ("tests/attention_zoo/test_nystromformer.py",),
    ),
    Mutant(
        "compiled_backward_under_forwards_autocast",
        "lra/module.py",
        "a compiled bf16 step traces its backward in the forward's autocast: the float32 attention's products in bf16",
        'with config.patch(backward_pass_autocast="off"):',
        'with config.patch(backward_pass_autocast="same_as_forward"):',
        ("tests/lra/test_compile_rows.py",),
    ),
    Mutant(
        "yoso_e_keys_unmasked",
        "attention_zoo/yoso.py",
        "YOSO-E's pair mask masks queries only: padded keys get collision weight",
        "pair_mask = (folded[:, :, None] & folded[:, None, :]).float()",
        "pair_mask = folded[:, :, None].float().expand(-1, -1, length)",
        YOSO,
    ),
    Mutant(
        "yoso_e_flex_partial_blocks_full",
        "attention_zoo/yoso.py",
        "yoso_e_flex's block mask marks every block with a real query and key full: its padded pairs count",
        "full = every[:, :, None] & every[:, None, :]",
        "full = some[:, :, None] & some[:, None, :]",
        YOSO,
    ),
    Mutant(
        "yoso_e_flex_surrogate_doubled",
        "attention_zoo/yoso.py",
        "yoso_e_flex's straight-through score has the derivative tau, not the lower bound's tau/2",
        "straight = score * hash_bits / 2",
        "straight = score * hash_bits",
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
        "real_features = features.masked_fill(~mask[..., None], 0.0)  # (b, n, dim)",
        "real_features = features  # (b, n, dim)",
        MODEL,
    ),
    Mutant(
        "encoder_padding_multiplied_out",
        "lra/model.py",
        "the pooling multiplies padded positions by zero instead of selecting them out: a NaN there reaches the mean",
        "real_features = features.masked_fill(~mask[..., None], 0.0)  # (b, n, dim)",
        "real_features = features * mask[..., None]  # (b, n, dim)",
        MODEL,
    ),
    Mutant(
        "encoder_masked_mean",
        "lra/model.py",
        "the pooled features are the mean over real tokens, not the original code's sum over the padded length",
        "return torch.bmm(ones, real_features).squeeze(1) / features.shape[1]  # (b, dim)",
        "return torch.bmm(ones, real_features).squeeze(1) / mask.sum(-1, keepdim=True)  # (b, dim)",
        MODEL,
    ),
    # Stopping and resuming.
    Mutant(
        "stop_ignores_metrics_rows",
        "lra/steps.py",
        "an interruption stops after a step that writes a metrics row",
        "return evaluates or trainer.global_step % trainer.log_every_n_steps == 0",
        "return evaluates",
        CALLBACKS,
    ),
    Mutant(
        "stop_ignores_evaluations",
        "lra/steps.py",
        "an interruption stops after a step that evaluates",
        "return evaluates or trainer.global_step",
        "return False or trainer.global_step",
        CALLBACKS,
    ),
    Mutant(
        "stop_ignores_the_epochs_end",
        "lra/steps.py",
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
        "if trainer.state.fn == TrainerFn.FITTING and not diverged(pl_module)",
        "if not diverged(pl_module)",
        CALLBACKS,
    ),
    Mutant(
        "resume_any_configuration",
        "lra/run.py",
        "a last.ckpt left by another configuration in the run's folder is taken for the run's own, not started afresh",
        "if not last.is_file() or (previous is not None and previous.config_hash != record.config_hash):",
        "if not last.is_file():",
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
        "lra/table/cells.py",
        "a ListOps mean of exactly 28% counts below the split",
        'side = (cells["mean"] >= LISTOPS_SPLIT) == (cells["paper"] >= LISTOPS_SPLIT)',
        'side = (cells["mean"] > LISTOPS_SPLIT) == (cells["paper"] >= LISTOPS_SPLIT)',
        TABLE,
    ),
    Mutant(
        "standard_error_not_over_sqrt_k",
        "lra/table/cells.py",
        "a cell's standard error over seeds is their standard deviation, not std / sqrt(k)",
        'cells["seed_error"] = (cells["std"] / np.sqrt(cells["num_seeds"])).where(',
        'cells["seed_error"] = (cells["std"]).where(',
        TABLE,
    ),
    Mutant(
        "standard_error_without_the_test_set",
        "lra/table/cells.py",
        "a cell of several seeds has their spread alone as its error, without the test set's they share",
        'cells["standard_error"] = np.hypot(cells["seed_error"], cells["test_error"])',
        'cells["standard_error"] = cells["seed_error"].where(cells["num_seeds"] > 1, cells["test_error"])',
        TABLE,
    ),
    Mutant(
        "best_without_margin",
        "lra/table/cells.py",
        "the best mean is bold however little it beats the next row by",
        'best[top.name] = top["mean"] - runner_up["mean"] > BEST_MARGIN * difference_error(runner_up, top)[0]',
        'best[top.name] = top["mean"] - runner_up["mean"] > 0',
        TABLE,
    ),
    Mutant(
        "paired_across_test_sets",
        "lra/table/cells.py",
        "two cells are paired sample by sample though they were tested on different test sets",
        'one_test_set = len(first["test_sets"]) == 1 and first["test_sets"] == second["test_sets"]',
        "one_test_set = True",
        TABLE,
    ),
    Mutant(
        "paired_error_of_one_cell",
        "lra/table/cells.py",
        "a paired difference's test-set error is one cell's per-sample spread, not the differences'",
        "test = 100 * np.sqrt((b - a).var() / len(a)) if paired",
        "test = 100 * np.sqrt(b.var() / len(a)) if paired",
        TABLE,
    ),
    Mutant(
        "spearman_from_two_rows",
        "lra/table/cells.py",
        "Spearman's rho is given from two rows",
        "    if len(ours) < MIN_RANKED_ROWS:\n        return math.nan",
        "    if len(ours) < 2:\n        return math.nan",
        TABLE,
    ),
    Mutant(
        "seeds_pooled_across_configurations",
        "lra/table/cells.py",
        "runs of different configurations are one run when their seed and status agree",
        'return runs.drop_duplicates(subset=["config_hash", "setting", ',
        "return runs.drop_duplicates(subset=[",
        TABLE,
    ),
    Mutant(
        "average_with_missing_tasks",
        "lra/table/sections.py",
        "a row's average is taken over the tasks it has, not only when it has all five",
        'return None if any(c is None for c in cells) else sum(c["mean"] for c in cells) / len(TASKS)',
        "cells = [c for c in cells if c is not None]\n"
        '        return sum(c["mean"] for c in cells) / len(cells) if cells else None',
        TABLE,
    ),
    # The CUDA kernels.
    cuda_mutant(
        "missing_barrier",
        "heavy_bucket_tables_kernel stages the next 256 key indices before every thread has read the previous ones",
        "      __syncthreads();  // the previous batch of staged indices is consumed\n",
        "",
    ),
    cuda_mutant(
        "warp_butterfly_reversed",
        "hash_codes_warp_kernel's lane holding b of a pair (a, b) keeps b - a instead of a - b",
        "x[k] = second ? __fsub_rn(other, x[k]) : __fadd_rn(x[k], other);",
        "x[k] = second ? __fsub_rn(x[k], other) : __fadd_rn(x[k], other);",
    ),
    cuda_mutant(
        "warp_code_bits_second_word_unshifted",
        "hash_codes_warp_kernel ors a code's second register word into the first instead of above it",
        "window |= static_cast<unsigned long long>(positive[k]) << 32;",
        "window |= positive[k];",
    ),
    cuda_mutant(
        "warp_code_bits_of_another_vector",
        "hash_codes_warp_kernel reads a code's bits from the ballot without shifting out the other vectors' lanes",
        "positive[k] = (__ballot_sync(0xffffffffu, x[k] > 0.0f) >> group) & group_bits;",
        "positive[k] = __ballot_sync(0xffffffffu, x[k] > 0.0f) & group_bits;",
    ),
    cuda_mutant(
        "missing_barrier_between_rotations",
        "hash_codes_kernel starts the next rotation while other threads still read the bits of this one",
        "    __syncthreads();  // the next rotation overwrites x\n",
        "",
    ),
    cuda_mutant(
        "off_by_one_read",
        "weighted_lookup_kernel enumerates one row past the end of a light bucket",
        "          const int count = static_cast<int>(min64(kWarp, hi - pos0));\n"
        "          const int lane_j = lane < count ? rows[pos0 + lane] : 0;\n"
        "          for (int t = 0; t < count; ++t) {\n"
        "            const int64_t j = __shfl_sync(kFullMask, lane_j, t);\n"
        "            const scalar_t* w = batch_weights + j * width;",
        "          const int count = static_cast<int>(min64(kWarp, hi + 1 - pos0));\n"
        "          const int lane_j = lane < count ? rows[pos0 + lane] : 0;\n"
        "          for (int t = 0; t < count; ++t) {\n"
        "            const int64_t j = __shfl_sync(kFullMask, lane_j, t);\n"
        "            const scalar_t* w = batch_weights + j * width;",
    ),
    cuda_mutant(
        "divergent_shuffle",
        "weighted_lookup_kernel's warp reduction of the pair weight runs only on the lanes that loaded a row",
        "            dot = warp_sum(dot);\n",
        "            if (lane < count) dot = warp_sum(dot);\n",
    ),
    cuda_mutant(
        "short_sort_end_bit",
        "the radix sort's end_bit leaves out the highest bit of the segment numbers",
        "  const int end_bit = hash_bits + 1 + bit_width(",
        "  const int end_bit = hash_bits + bit_width(",
    ),
    cuda_mutant(
        "oversized_block",
        "blocks of 64 warps (2048 threads)",
        "constexpr int kWarpsPerBlock = 8;",
        "constexpr int kWarpsPerBlock = 64;",
    ),
    cuda_mutant(
        "lost_chunk_sums",
        "cumulation_query_kernel starts each chunk of hashes from zero instead of the sums of the earlier chunks",
        "      acc[k] = column < channels ? out_row[column] : 0.0f;\n"
        "    }\n"
        "    for (int hl = 0; hl < hc; ++hl) {\n"
        "      const int64_t segment = b * hc + hl;\n"
        "      const int64_t base = segment * num_keys;\n"
        "      const key_t key = bucket_key(segment0 + segment, query_codes[query * num_hashes + h0 + hl], hash_bits);\n"
        "      int64_t lo, hi;\n"
        "      if (!find_bucket(keys, base, num_keys, key, lo, hi)) {\n"
        "        continue;\n"
        "      }\n"
        "#pragma unroll",
        "      acc[k] = 0.0f;\n"
        "    }\n"
        "    for (int hl = 0; hl < hc; ++hl) {\n"
        "      const int64_t segment = b * hc + hl;\n"
        "      const int64_t base = segment * num_keys;\n"
        "      const key_t key = bucket_key(segment0 + segment, query_codes[query * num_hashes + h0 + hl], hash_bits);\n"
        "      int64_t lo, hi;\n"
        "      if (!find_bucket(keys, base, num_keys, key, lo, hi)) {\n"
        "        continue;\n"
        "      }\n"
        "#pragma unroll",
    ),
    cuda_mutant(
        "racy_bucket_runs",
        "bucket_index_kernel lets a run's rows and its tail read the table before the run's head has moved the cursor",
        "          if (step == 2 && tail) {\n"
        "            ends[code] += p + 1;\n"
        "          }\n"
        "        }\n"
        "        __syncthreads();\n",
        "          if (step == 2 && tail) {\n            ends[code] += p + 1;\n          }\n        }\n",
    ),
    cuda_mutant(
        "unranked_bucket_rows",
        "bucket_index_kernel places every row of a run at the run's cursor, ignoring its place in the run",
        "            segment_rows[ends[code] + p] = ",
        "            segment_rows[ends[code]] = ",
    ),
    cuda_mutant(
        "inclusive_bucket_scan",
        "bucket_index_kernel starts each bucket at its end (an inclusive scan of the counts)",
        "  return before + inclusive - value;\n",
        "  return before + inclusive;\n",
    ),
    cuda_mutant(
        "stale_round_keys",
        "bucket_index_kernel's placement pass reuses the counting pass's last sorted round instead of sorting each round again",
        "      if (pass == 0 || num_rows > round) {\n",
        "      if (pass == 0) {\n",
    ),
    cuda_mutant(
        "round_end_tail_missed",
        "bucket_index_kernel never ends a run at the end of a round, so the last bucket of each round loses its rows",
        "          const bool tail = p == round - 1 || ",
        "          const bool tail = ",
    ),
    cuda_mutant(
        "stale_first_hashes",
        "weighted_lookup_kernel adds to the output's previous contents on the first (or only) chunk of hashes",
        "      acc[k] = !first && column < channels ? out_row[column] : 0.0f;\n",
        "      acc[k] = column < channels ? out_row[column] : 0.0f;\n",
    ),
    cuda_mutant(
        "misrouted_second_direction",
        "weighted_lookup_kernel gives the first warp of the second direction the first direction's pass",
        "  const bool second = warp >= lookups0;\n",
        "  const bool second = warp > lookups0;\n",
    ),
    cuda_mutant(
        "unwritten_padded_rows",
        "weighted_lookup_kernel leaves a padded lookup row unwritten (the output is not zero-filled)",
        "    for (int64_t column = lane; first && column < channels; column += kWarp) {\n      out_row[column] = 0.0f;\n    }\n",
        "",
    ),
    # Carried state: what crosses from one machine to the next, and what becomes a committed number.
    Mutant(
        "checkpoint_digest_unchecked",
        "lra/checkpoints.py",
        "a checkpoint changed after it was written is read as it is",
        "if recorded and sha256(data) not in recorded:",
        "if False:",
        CARRIED,
    ),
    Mutant(
        "checkpoint_unpickles_anything",
        "lra/checkpoints.py",
        "a checkpoint is unpickled with torch's full unpickler, which runs what it holds",
        'torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)',
        'torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)',
        CARRIED,
    ),
    Mutant(
        "archive_part_size_only",
        "lra/campaign/archive.py",
        "a part is checked for its size only: a flipped bit passes",
        'if len(piece) != part["size"] or sha256(piece) != part["sha256"]:',
        'if len(piece) != part["size"]:',
        CARRIED,
    ),
    Mutant(
        "archive_member_components_unchecked",
        "lra/campaign/archive.py",
        "a member's name may have '.' or '..' components (a name that stays in its folder by chance is unpacked)",
        'well_formed = member.isfile() and all(COMPONENT.fullmatch(p) and p not in (".", "..") for p in parts)',
        "well_formed = member.isfile()",
        CARRIED,
    ),
    Mutant(
        "record_test_accuracy_unchecked",
        "lra/finished.py",
        "a record's test accuracy is not checked against the one its run logged",
        "if accuracy is None or record.test_acc is None or abs(accuracy - record.test_acc) > TEST_ACC_TOLERANCE:",
        "if False:",
        CARRIED,
    ),
    Mutant(
        "record_test_correct_unchecked",
        "lra/finished.py",
        "a record's per-sample test results are not checked against its test accuracy and test set",
        "if record.test_correct is not None and (problem := per_sample_problem(record)):",
        "if False:",
        TABLE,
    ),
    Mutant(
        "evaluated_split_shuffled",
        "lra/datamodule.py",
        "a split evaluated again is read shuffled, so its answers no longer line up with the samples",
        "return self._loader(split, shuffle=False, drop_last=False)",
        "return self._loader(split, shuffle=True, drop_last=False)",
        EVALUATE,
    ),
    Mutant(
        "readme_seed_1_mistyped",
        "README.md",
        "a later seed's test accuracy is typed into the README's table wrong (two digits swapped)",
        "| YOSO-32 | 34.45 ± 1.06 | 33.85 ± 1.06 |",
        "| YOSO-32 | 34.45 ± 1.06 | 33.58 ± 1.06 |",
        TABLE,
    ),
    Mutant(
        "curves_seeds_one_shade",
        "lra/table/curves.py",
        "every seed of a row is drawn in the same shade, so a panel's seeds cannot be told apart",
        "    shade = SEED_SHADES[min(seed, len(SEED_SHADES) - 1)]",
        "    shade = SEED_SHADES[0]",
        TABLE,
    ),
    Mutant(
        "older_record_replaces_newer",
        "lra/finished.py",
        "an older run's record replaces the newer committed one",
        'return Commit("kept", path, record, curve)',
        'return Commit("replaces", path, record, curve)',
        CARRIED,
    ),
    Mutant(
        "restore_deletes_before_swap",
        "lra/campaign/restore.py",
        "a restored cell's folder is removed before its replacement is in place",
        "        if folder.is_dir():\n            os.replace(folder, replaced)\n",
        "        if folder.is_dir():\n            shutil.rmtree(folder)\n",
        CARRIED,
    ),
    cuda_mutant(
        "heavy_table_of_the_wrong_side",
        "heavy_bucket_tables_kernel numbers the second direction's slots from the first's",
        "  const int64_t item = static_cast<int64_t>(blockIdx.x) - (second ? slots0 : 0);\n",
        "  const int64_t item = static_cast<int64_t>(blockIdx.x);\n",
    ),
    cuda_mutant(
        "plain_sums_weighted",
        "heavy_bucket_tables_kernel's column of ones (grad V's bucket sums in lsh_lower_bound_gradients) holds zeros",
        "            const float value = c[k] < channels ? static_cast<float>(batch_values[j * channels + c[k]]) : 1.0f;\n",
        "            const float value = c[k] < channels ? static_cast<float>(batch_values[j * channels + c[k]]) : 0.0f;\n",
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


def tests_folder(kind: Kind, copy: Path) -> Path:
    """Where a kind's tests run: the temporary copy, or the repository where the mutated file is kept outside it."""
    return ROOT if kind.source_variable else copy


@contextlib.contextmanager
def applied(mutant: Mutant, text: str, copy: Path) -> Iterator[dict[str, str]]:
    """Put the mutated ``text`` where ``mutant``'s tests read it; yields the variables that point them at it."""
    kind = KINDS[mutant.kind]
    if kind.source_variable:
        path = extensions_root() / "yoso_mutants" / mutant.name / Path(mutant.path).name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        yield {kind.source_variable: str(path)}
        return
    target = copy / mutant.path
    original = target.read_text()
    target.write_text(text)
    try:
        yield {}
    finally:
        target.write_text(original)


def sanitized_environment() -> dict[str, str]:
    """The variables that run the emulated tests on the build with AddressSanitizer and UndefinedBehaviorSanitizer."""
    return {"YOSO_EMULATOR_SANITIZE": "1", "LD_PRELOAD": sanitizer_preload(), "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1"}


@dataclass(frozen=True)
class Outcome:
    passed: bool
    failure: str  # the first failing test and why, or how it timed out
    seconds: float
    timed_out: bool = False


def run_tests(folder: Path, tests: tuple[str, ...], kind: Kind, variables: dict[str, str]) -> Outcome:
    """Run ``tests`` in ``folder`` as ``kind`` runs them, with ``variables`` set."""
    env = {**os.environ, "PYTHONPATH": str(folder), "PYTHONDONTWRITEBYTECODE": "1", **dict(kind.environment), **variables}
    env.setdefault("OMP_NUM_THREADS", "1")
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *kind.pytest_args, *tests]
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)  # fmt: skip
    try:
        output, _ = process.communicate(timeout=kind.timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the tests' own children (a forked pool) too
        process.communicate()
        hang = f"TIMED OUT after {kind.timeout_s} s (a hang: run it again with --only)"
        return Outcome(False, hang, time.perf_counter() - start, timed_out=True)
    seconds = time.perf_counter() - start
    if process.returncode == 0:
        return Outcome(True, "", seconds)
    failed = re.search(r"^(?:FAILED|ERROR) (\S+)", output, re.M)
    # A sanitizer's report aborts the process before pytest can report the failing test.
    reason = re.search(r"^E\s+(.+)$", output, re.M) or re.search(r"(AddressSanitizer: .+|runtime error: .+)", output)
    ended = f"was killed by signal {-process.returncode}" if process.returncode < 0 else f"exited {process.returncode}"
    test = failed.group(1) if failed else f"(no test failed: pytest {ended})"
    why = reason.group(1).strip() if reason else output.strip().splitlines()[-1] if output.strip() else ""
    return Outcome(False, f"{test}: {why[:300]}", seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="name the chosen mutants and exit")
    parser.add_argument("--only", nargs="+", choices=[m.name for m in MUTANTS], metavar="NAME", help="only these mutants")
    parser.add_argument("--kind", choices=sorted(KINDS), help="only the mutants of this kind")
    parser.add_argument("--out", type=Path, help="also write the table (Markdown) to this file")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTANTS if (not args.only or m.name in args.only) and (not args.kind or m.kind == args.kind)]
    if not chosen:
        parser.error(f"no mutant named by --only is of kind {args.kind}: drop --kind or name mutants of that kind")
    if args.list:
        for mutant in chosen:
            print(f"{mutant.name:40s} {mutant.kind:6s} {mutant.path:36s} {mutant.bug}")
        return 0
    mutated = {m.name: mutate((ROOT / m.path).read_text(), m) for m in chosen}  # every snippet checked before anything runs
    rows = ["| mutant | kind | file | bug | killed by | seconds |", "| --- | --- | --- | --- | --- | --- |"]
    survivors = []
    unmutated: dict[tuple[str, bool], Outcome] = {}  # (kind, sanitized): the unmutated sources' run of that kind's tests
    with tempfile.TemporaryDirectory(prefix="lra_mutants_") as folder:
        copy = Path(folder)
        copy_tree(copy)
        for mutant in chosen:
            kind = KINDS[mutant.kind]
            killed_by, seconds, timed_out = "SURVIVED", 0.0, False
            for sanitized in (False, True) if kind.sanitized_pass else (False,):
                variables = sanitized_environment() if sanitized else {}
                build = " on the sanitized build" if sanitized else ""
                if (mutant.kind, sanitized) not in unmutated:
                    tests = tuple(dict.fromkeys(test for m in chosen if m.kind == mutant.kind for test in m.tests))
                    outcome = unmutated[mutant.kind, sanitized] = run_tests(tests_folder(kind, copy), tests, kind, variables)
                    verdict = "they pass" if outcome.passed else f"FAIL: {outcome.failure}"
                    print(f"unmutated sources, {mutant.kind} tests{build}: {verdict} ({outcome.seconds:.0f} s)", flush=True)
                if not unmutated[mutant.kind, sanitized].passed:
                    return 2
                with applied(mutant, mutated[mutant.name], copy) as source:
                    outcome = run_tests(tests_folder(kind, copy), mutant.tests, kind, {**variables, **source})
                seconds += outcome.seconds
                if not outcome.passed:
                    killed_by, timed_out = f"{outcome.failure}{build}".replace("|", "/"), outcome.timed_out
                    break
            if killed_by == "SURVIVED" or timed_out:
                survivors.append(mutant.name)
            row = f"| `{mutant.name}` | {mutant.kind} | {mutant.path} | {mutant.bug} | {killed_by} | {seconds:.0f} |"
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
