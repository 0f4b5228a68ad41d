"""Inject plausible bugs into a copy of the CUDA kernels and show that the emulated test suite fails on each.

``python -m yoso_cuda.emulator.mutants [--only NAME ...] [--out FILE]`` writes each mutant's copy of
``csrc/cuda/yoso_cuda.cu`` into a temporary folder, runs ``tests/yoso_cuda/test_emulated_cuda.py``
against it (``YOSO_EMULATOR_SOURCE``), and, if that passes, the same tests on the sanitized build.
A mutant is caught when a run fails; the table says which test failed first and why. The copies
live in torch's extensions folder (``yoso_mutants/``), so a second run reuses their builds. Each
mutation replaces one exact snippet of the source, so a change to the kernels that removes the
snippet fails here loudly rather than testing nothing. Exit status 1 if any mutant survives.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from torch.utils import cpp_extension

from . import CUDA_SOURCE, sanitizer_preload

TESTS = Path(__file__).resolve().parents[2] / "tests" / "yoso_cuda" / "test_emulated_cuda.py"


@dataclass(frozen=True)
class Mutant:
    name: str
    bug: str
    original: str
    mutated: str


MUTANTS = [
    Mutant(
        "missing_barrier",
        "heavy_bucket_tables_kernel stages the next 256 key indices without waiting until every thread has read the previous ones",
        "      __syncthreads();  // the previous batch of staged indices is consumed\n",
        "",
    ),
    Mutant(
        "missing_barrier_between_rotations",
        "hash_codes_kernel starts the next rotation while other threads still read the bits of this one",
        "    __syncthreads();  // the next rotation overwrites x\n",
        "",
    ),
    Mutant(
        "off_by_one_read",
        "weighted_lookup_kernel enumerates one row past the end of a light bucket",
        "          const int count = static_cast<int>(min64(kWarp, hi - pos0));\n          const int lane_j = lane < count ? rows[pos0 + lane] : 0;\n"
        "          for (int t = 0; t < count; ++t) {\n            const int64_t j = __shfl_sync(kFullMask, lane_j, t);\n"
        "            const scalar_t* w = batch_weights + j * width;",
        "          const int count = static_cast<int>(min64(kWarp, hi + 1 - pos0));\n          const int lane_j = lane < count ? rows[pos0 + lane] : 0;\n"
        "          for (int t = 0; t < count; ++t) {\n            const int64_t j = __shfl_sync(kFullMask, lane_j, t);\n"
        "            const scalar_t* w = batch_weights + j * width;",
    ),
    Mutant(
        "divergent_shuffle",
        "weighted_lookup_kernel's warp reduction of the pair weight runs only on the lanes that loaded a row",
        "            dot = warp_sum(dot);\n",
        "            if (lane < count) dot = warp_sum(dot);\n",
    ),
    Mutant(
        "short_sort_end_bit",
        "the radix sort's end_bit leaves out the highest bit of the segment numbers",
        "  const int end_bit = hash_bits + 1 + bit_width(",
        "  const int end_bit = hash_bits + bit_width(",
    ),
    Mutant(
        "oversized_block",
        "blocks of 64 warps (2048 threads)",
        "constexpr int kWarpsPerBlock = 8;",
        "constexpr int kWarpsPerBlock = 64;",
    ),
    Mutant(
        "lost_chunk_sums",
        "cumulation_query_kernel starts each chunk of hashes from zero instead of the sums of the earlier chunks",
        "      acc[k] = column < channels ? out_row[column] : 0.0f;\n    }\n    for (int hl = 0; hl < hc; ++hl) {\n"
        "      const int64_t segment = b * hc + hl;\n      const int64_t base = segment * num_keys;\n"
        "      const key_t key = bucket_key(segment0 + segment, query_codes[query * num_hashes + h0 + hl], hash_bits);\n"
        "      int64_t lo, hi;\n      if (!find_bucket(keys, base, num_keys, key, lo, hi)) {\n        continue;\n      }\n#pragma unroll",
        "      acc[k] = 0.0f;\n    }\n    for (int hl = 0; hl < hc; ++hl) {\n"
        "      const int64_t segment = b * hc + hl;\n      const int64_t base = segment * num_keys;\n"
        "      const key_t key = bucket_key(segment0 + segment, query_codes[query * num_hashes + h0 + hl], hash_bits);\n"
        "      int64_t lo, hi;\n      if (!find_bucket(keys, base, num_keys, key, lo, hi)) {\n        continue;\n      }\n#pragma unroll",
    ),
    Mutant(
        "racy_bucket_runs",
        "bucket_index_kernel lets a run's rows and its tail read the table before the run's head has moved the cursor",
        "          if (step == 2 && tail) {\n            ends[code] += p + 1;\n          }\n        }\n        __syncthreads();\n",
        "          if (step == 2 && tail) {\n            ends[code] += p + 1;\n          }\n        }\n",
    ),
    Mutant(
        "unranked_bucket_rows",
        "bucket_index_kernel places every row of a run at the run's cursor, ignoring its place in the run",
        "            segment_rows[ends[code] + p] = ",
        "            segment_rows[ends[code]] = ",
    ),
    Mutant(
        "inclusive_bucket_scan",
        "bucket_index_kernel starts each bucket at its end (an inclusive scan of the counts)",
        "  return before + inclusive - value;\n",
        "  return before + inclusive;\n",
    ),
    Mutant(
        "stale_round_keys",
        "bucket_index_kernel's placement pass reuses the counting pass's last sorted round instead of sorting each round again",
        "      if (pass == 0 || num_rows > round) {\n",
        "      if (pass == 0) {\n",
    ),
    Mutant(
        "round_end_tail_missed",
        "bucket_index_kernel never ends a run at the end of a round, so the last bucket of each round loses its rows",
        "          const bool tail = p == round - 1 || ",
        "          const bool tail = ",
    ),
    Mutant(
        "stale_first_hashes",
        "weighted_lookup_kernel adds to the output's previous contents on the first (or only) chunk of hashes",
        "      acc[k] = !first && column < channels ? out_row[column] : 0.0f;\n",
        "      acc[k] = column < channels ? out_row[column] : 0.0f;\n",
    ),
    Mutant(
        "misrouted_second_direction",
        "weighted_lookup_kernel gives the first warp of the second direction the first direction's pass",
        "  const bool second = warp >= lookups0;\n",
        "  const bool second = warp > lookups0;\n",
    ),
    Mutant(
        "unwritten_padded_rows",
        "weighted_lookup_kernel leaves a padded lookup row unwritten (the output is not zero-filled)",
        "    for (int64_t column = lane; first && column < channels; column += kWarp) {\n      out_row[column] = 0.0f;\n    }\n",
        "",
    ),
    Mutant(
        "heavy_table_of_the_wrong_side",
        "heavy_bucket_tables_kernel numbers the second direction's slots from the first's",
        "  const int64_t item = static_cast<int64_t>(blockIdx.x) - (second ? slots0 : 0);\n",
        "  const int64_t item = static_cast<int64_t>(blockIdx.x);\n",
    ),
    Mutant(
        "plain_sums_weighted",
        "heavy_bucket_tables_kernel's column of ones (grad V's bucket sums in lsh_lower_bound_gradients) holds zeros",
        "            const float value = c[k] < channels ? static_cast<float>(batch_values[j * channels + c[k]]) : 1.0f;\n",
        "            const float value = c[k] < channels ? static_cast<float>(batch_values[j * channels + c[k]]) : 0.0f;\n",
    ),
]


def mutate(source: str, mutant: Mutant) -> str:
    found = source.count(mutant.original)
    if found != 1:
        raise SystemExit(
            f"mutant {mutant.name}: its snippet occurs {found} times in {CUDA_SOURCE} (expected once): update MUTANTS"
        )
    return source.replace(mutant.original, mutant.mutated)


def run_suite(source: Path, sanitize: bool) -> tuple[bool, str, float]:
    """(caught, first failure, seconds) of the emulated suite against ``source``."""
    env = {**os.environ, "YOSO_EMULATOR_SOURCE": str(source)}
    if sanitize:
        env.update(YOSO_EMULATOR_SANITIZE="1", LD_PRELOAD=sanitizer_preload(), ASAN_OPTIONS="detect_leaks=0:abort_on_error=1")
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", str(TESTS), "-k", "not sanitized_build"]
    start = time.perf_counter()
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode == 0:
        return False, "", seconds
    output = result.stdout + result.stderr
    failed = re.search(r"^(?:FAILED|ERROR) (\S+)", output, re.M)
    reason = re.search(r"^E\s+(.+)$", output, re.M) or re.search(r"(AddressSanitizer: [^\n]+|runtime error: [^\n]+)", output)
    test = failed.group(1).split("::", 1)[-1] if failed else "(the run crashed)"
    return True, f"{test}: {reason.group(1).strip()[:500] if reason else output.strip().splitlines()[-1][:500]}", seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=[m.name for m in MUTANTS], help="run only these mutants")
    parser.add_argument("--out", type=Path, help="also write the table (Markdown) to this file")
    args = parser.parse_args(argv)
    source = CUDA_SOURCE.read_text()
    rows = ["| mutant | bug | caught by | first failure | seconds |", "| --- | --- | --- | --- | --- |"]
    survivors = []
    folder = Path(cpp_extension.get_default_build_root()) / "yoso_mutants"
    for mutant in MUTANTS:
        if args.only and mutant.name not in args.only:
            continue
        path = folder / mutant.name / CUDA_SOURCE.name
        path.parent.mkdir(parents=True, exist_ok=True)
        text = mutate(source, mutant)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
        caught_by, failure, seconds = "nothing", "", 0.0
        for sanitize in (False, True):
            caught, failure, elapsed = run_suite(path, sanitize)
            seconds += elapsed
            if caught:
                caught_by = "sanitized suite" if sanitize else "emulated suite"
                break
        if caught_by == "nothing":
            survivors.append(mutant.name)
        row = f"| `{mutant.name}` | {mutant.bug} | {caught_by} | {failure.replace('|', '/')} | {seconds:.0f} |"
        rows.append(row)
        print(row, flush=True)
    table = "\n".join(rows)
    if args.out:
        args.out.write_text(table + "\n")
    print(
        f"\n{len(rows) - 2 - len(survivors)} of {len(rows) - 2} mutants caught"
        + (f"; survived: {', '.join(survivors)}" if survivors else "")
    )
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
