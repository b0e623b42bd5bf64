"""The layering of CONTRIBUTING.md, checked on the code: no import cycles, no upward imports.

Every import counts -- module level, inside functions, and under ``TYPE_CHECKING`` -- because
a lazy import that closes a cycle is still a cycle for a reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

#: Layer of each top-level part of pdpfl: a module may import only parts of its own layer or
#: below. ``pdpfl`` itself (the package face) and ``testing`` sit on top.
LAYERS: dict[str, int] = {
    "_version": 0,
    "registry": 0,
    "io": 0,
    "seeding": 0,
    "privacy": 0,
    "errors": 0,
    "integrity": 0,
    "logs": 0,
    "safe_yaml": 0,
    "config_checks": 0,
    "budgets": 1,
    "calibration": 1,
    "checkpoint": 1,
    "crypto": 1,
    "data": 1,
    "randomness": 1,
    "discrete_table": 1,
    "discrete_noise": 1,
    "ledger": 2,
    "models": 2,
    "dp": 3,
    "config": 4,
    "fl": 5,
    "runtime": 6,
    "api": 7,
    "audit": 7,
    "reproduce": 7,
    "tune": 7,
    "testing": 7,
    "reports": 7,
    "cli": 8,
    "__init__": 9,
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in SRC.joinpath("pdpfl").rglob("*.py")}
    edges: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(
                        package.split(".")[: len(package.split(".")) - node.level + 1]
                        + ([base] if base else [])
                    )
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names
                ]
            for target in targets:
                while target and target not in files:
                    target = target.rpartition(".")[0]
                if target.startswith("pdpfl") and target != mod:
                    edges[mod].add(target)
    return edges


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_part_has_a_layer() -> None:
    missing = {_part(m) for m in _graph()} - set(LAYERS)
    assert not missing, f"add these to LAYERS (and to CONTRIBUTING.md): {sorted(missing)}"


def test_no_module_imports_a_higher_layer() -> None:
    upward = sorted(
        f"{a} -> {b}"
        for a, targets in _graph().items()
        for b in targets
        if LAYERS[_part(b)] > LAYERS[_part(a)]
    )
    assert not upward, "imports that reach up a layer:\n" + "\n".join(upward)


def test_no_import_cycles() -> None:
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["rpdp", "idp_fedavg", "uldp", "prifedsync", "idp_sgd"])
def test_algorithm_packages_do_not_import_each_other(algorithm: str) -> None:
    others = {"rpdp", "idp_fedavg", "uldp", "prifedsync", "idp_sgd"} - {algorithm}
    prefix = f"pdpfl.fl.{algorithm}"
    bad = sorted(
        f"{a} -> {b}"
        for a, targets in _graph().items()
        if a == prefix or a.startswith(prefix + ".")
        for b in targets
        if any(b == f"pdpfl.fl.{o}" or b.startswith(f"pdpfl.fl.{o}.") for o in others)
    )
    assert not bad, "\n".join(bad)


#: Private names imported across packages: none (a name another package needs is public).
PRIVATE_IMPORTS_ALLOWED: set[str] = set()


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_imports() -> set[str]:
    """``module -> target`` for every private name (``_x``) or name from a private module
    (``pkg._mod``) that a module imports from another package (its own package's are fine;
    ``pdpfl._version`` is the generated version file)."""
    files = {_module_name(p): p for p in SRC.joinpath("pdpfl").rglob("*.py")}
    packages = {m for m, p in files.items() if p.name == "__init__.py"}

    def package(module: str) -> str:
        return module if module in packages else module.rpartition(".")[0]

    found = set()
    for mod, path in files.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            pairs: list[tuple[str, str]] = []
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    pairs.append((full if full in files else node.module, alias.name))
            elif isinstance(node, ast.Import):
                pairs = [(a.name, "") for a in node.names]
            for target, name in pairs:
                if not target.startswith("pdpfl") or target == "pdpfl._version":
                    continue
                hidden = _private(name) or any(_private(p) for p in target.split(".")[1:])
                if hidden and package(target) != package(mod):
                    found.add(
                        f"{mod} -> {target if target.endswith(name) else target + '.' + name}"
                    )
    return found


def test_no_private_name_is_imported_across_packages() -> None:
    new = sorted(_private_imports() - PRIVATE_IMPORTS_ALLOWED)
    assert not new, "import a public name instead (or make it public):\n" + "\n".join(new)
