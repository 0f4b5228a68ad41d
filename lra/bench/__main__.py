"""``python -m lra.bench {kernels,efficiency,step,approx,gpu,pathfinder_cnn,authors} [options]``: run one benchmark; each takes
``--help``. ``step`` times the LRA model's full training step per task and attention (:mod:`lra.bench.step`); ``gpu`` runs
YOSO's CUDA validation and the GPU benchmarks in one go (:mod:`lra.bench.gpu`); ``authors`` times the step beside the
authors' PyTorch LRA code (:mod:`lra.bench.authors`)."""

import argparse
import sys

from . import approx, authors, efficiency, gpu, kernels, pathfinder_cnn, step

BENCHMARKS = {
    "kernels": kernels,
    "efficiency": efficiency,
    "step": step,
    "approx": approx,
    "gpu": gpu,
    "pathfinder_cnn": pathfinder_cnn,
    "authors": authors,
}


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(
        prog="python -m lra.bench",
        description="Benchmarks that write CSV and PNG results (into results/ unless --out says otherwise).",
        epilog="Each benchmark's options: python -m lra.bench BENCHMARK --help",
    )
    commands = main.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    for name, module in BENCHMARKS.items():
        # The benchmark parses its own options; its first docstring line says what it measures.
        commands.add_parser(name, help=module.__doc__.split("\n\n")[0].replace("\n", " "), add_help=False)
    return main


def main(argv: list[str] | None = None) -> int:
    args, options = parser().parse_known_args(argv)
    return BENCHMARKS[args.benchmark].main(options)


if __name__ == "__main__":
    sys.exit(main())
