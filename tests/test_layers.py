"""The packages' layers: every module of ``lra`` imports only from its own layer or the ones below it (function-level
imports included), and no two modules import each other through any chain. The layers, from the bottom up, are the
README's map of the code; a new module joins one of them here.

``attention_zoo`` and ``yoso_cuda`` sit below ``lra`` and never import it (DESIGN: ``lra`` -> ``attention_zoo`` ->
``yoso_cuda``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = [  # bottom first; a module's layer is the first whose prefix names it (a package's prefix names its modules)
    (
        "foundations",
        ("lra.files", "lra.signals", "lra.steps", "lra.paper", "lra.protocol", "lra.console", "lra.devices", "lra.conf"),
    ),
    ("data", ("lra.data.",)),
    ("model", ("lra.model",)),
    ("records", ("lra.results", "lra.checkpoints", "lra.rows", "lra.run_lock")),
    ("configuration", ("lra.config", "lra.finished")),
    ("training", ("lra.module", "lra.callbacks", "lra.loggers", "lra.datamodule")),
    ("fit", ("lra.fit",)),
    ("run", ("lra.run",)),
    ("sweep", ("lra.sweep",)),
    ("table", ("lra.table",)),
    ("campaign", ("lra.campaign",)),
    ("bench", ("lra.bench",)),
    ("commands", ("lra.train", "lra.evaluate", "lra.data.__main__", "lra", "lra.data")),  # entry points and package docstrings
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted((ROOT / "lra").rglob("*.py"))}


def layer_of(module: str) -> int:
    exact = [i for i, (_, names) in enumerate(LAYERS) if module in names]
    if exact:
        return exact[0]
    for i, (_, names) in enumerate(LAYERS):
        if any(module.startswith(name if name.endswith(".") else name + ".") or module == name for name in names):
            return i
    raise AssertionError(f"{module} is in no layer of tests/test_layers.py: add it to one")


def imports(module: str) -> set[str]:
    """The modules of ``lra`` that ``module`` imports, anywhere in it."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            targets = [f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in MODULES else prefix for alias in node.names]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != module:
                found.add(target)
    return found


def test_every_module_imports_only_from_its_layer_or_below():
    upward = [
        f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
        for module in MODULES
        for target in sorted(imports(module))
        if layer_of(target) > layer_of(module)
    ]
    assert not upward, "\n".join(upward)


def test_no_import_circle():
    graph = {module: imports(module) for module in MODULES}
    state: dict[str, str] = {}

    def visit(module: str, chain: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                pytest.fail("an import circle: " + " -> ".join([*chain[chain.index(target) :], target]))
            if target not in state:
                visit(target, [*chain, target])
        state[module] = "done"

    for module in MODULES:
        if module not in state:
            visit(module, [module])


@pytest.mark.parametrize("package", ["attention_zoo", "yoso_cuda"])
def test_the_lower_packages_never_import_lra(package):
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            assert not any(name == "lra" or name.startswith("lra.") for name in names), path
