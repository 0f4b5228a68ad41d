"""``python -m lra.bench {kernels,efficiency,step,approx,gpu,pathfinder_cnn,authors} [options]``: run one benchmark; each takes
``--help``. ``step`` times the LRA model's full training step per task and attention (:mod:`lra.bench.step`); ``gpu`` runs
YOSO's CUDA validation and the GPU benchmarks in one go (:mod:`lra.bench.gpu`); ``authors`` times the step beside the
authors' PyTorch LRA code (:mod:`lra.bench.authors`)."""

import argparse
import ast
import importlib
import importlib.util
import sys
from pathlib import Path

BENCHMARKS = ("kernels", "efficiency", "step", "approx", "gpu", "pathfinder_cnn", "authors")  # modules of lra.bench


def summary(benchmark: str) -> str:
    """The first paragraph of the benchmark module's docstring, read without importing the module: the benchmarks
    that train import Lightning and Dynamo (2 s), which ``--help`` and the other benchmarks do without."""
    source = Path(importlib.util.find_spec(f"{__package__}.{benchmark}").origin).read_text()
    return ast.get_docstring(ast.parse(source)).split("\n\n")[0].replace("\n", " ")


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(
        prog="python -m lra.bench",
        description="Benchmarks that write CSV and PNG results (into results/ unless --out says otherwise).",
        epilog="Each benchmark's options: python -m lra.bench BENCHMARK --help",
    )
    commands = main.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    for name in BENCHMARKS:
        # The benchmark parses its own options; its first docstring line says what it measures.
        commands.add_parser(name, help=summary(name), add_help=False)
    return main


def main(argv: list[str] | None = None) -> int:
    args, options = parser().parse_known_args(argv)
    return importlib.import_module(f"{__package__}.{args.benchmark}").main(options)


if __name__ == "__main__":
    sys.exit(main())
