"""``python -m lra.bench kernels|efficiency|approx|gpu ...``: run one benchmark (see each module's docstring);
``gpu`` runs YOSO's CUDA validation and the GPU benchmarks in one go (:mod:`lra.bench.gpu`)."""

import sys

from . import approx, efficiency, gpu, kernels

BENCHMARKS = {"kernels": kernels.main, "efficiency": efficiency.main, "approx": approx.main, "gpu": gpu.main}


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in BENCHMARKS:
        print(f"usage: python -m lra.bench {{{','.join(BENCHMARKS)}}} [options]; each takes --help")
        return 2
    return BENCHMARKS[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
