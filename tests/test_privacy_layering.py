"""The privacy core's layering, read from the source with ``ast`` (every import counts).

Module-level and function-level imports alike (a lazy import inside a function is still an
edge), ``TYPE_CHECKING`` imports included:

1. no import cycle among the modules of ``pdpfl.privacy`` and ``pdpfl.calibration``;
2. ``pdpfl.privacy`` imports nothing of pdpfl outside ``pdpfl.privacy``; ``pdpfl.calibration``
   only ``pdpfl.privacy``, itself and ``pdpfl.budgets`` (plain numpy);
3. neither imports torch.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pdpfl

SRC = Path(pdpfl.__file__).resolve().parent
PACKAGES = ("privacy", "calibration")


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in sorted((SRC / pkg).rglob("*.py")):
            out[_module_name(path)] = path
    return out


def _imports(name: str, path: Path) -> set[str]:
    """Every module ``name`` imports (absolute names; relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.add(mod)
            # ``from pkg import sub`` imports the submodule pkg.sub when it is one
            for alias in node.names:
                found.add(f"{mod}.{alias.name}")
    return found


MODULES = _modules()
EDGES = {
    name: {m for m in _imports(name, path) if m in MODULES and m != name}
    for name, path in MODULES.items()
}
ALL_IMPORTS = {name: _imports(name, path) for name, path in MODULES.items()}


def test_the_scan_sees_the_modules_and_function_level_imports() -> None:
    assert "pdpfl.privacy.accountant" in MODULES and "pdpfl.calibration.certified" in MODULES
    # a function-level import is an edge (pld imports dp-accounting inside a function)
    assert any(m.startswith("dp_accounting") for m in ALL_IMPORTS["pdpfl.privacy.pld"])


def _cycle() -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(EDGES[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(EDGES):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_import_cycle_in_privacy_and_calibration() -> None:
    assert _cycle() is None, " -> ".join(_cycle() or [])


def test_cycle_detection_finds_a_planted_cycle() -> None:
    saved = {k: set(v) for k, v in EDGES.items()}
    try:
        EDGES["pdpfl.privacy.rdp"].add("pdpfl.privacy.accountant")
        assert _cycle() is not None
    finally:
        EDGES.clear()
        EDGES.update(saved)


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith("pdpfl.privacy")))
def test_privacy_imports_nothing_of_pdpfl_outside_privacy(name: str) -> None:
    outside = {
        m
        for m in ALL_IMPORTS[name]
        if (m == "pdpfl" or m.startswith("pdpfl.")) and not m.startswith("pdpfl.privacy")
    }
    assert not outside, f"{name} imports {sorted(outside)}"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith("pdpfl.calibration")))
def test_calibration_imports_only_privacy_and_budgets(name: str) -> None:
    allowed = ("pdpfl.privacy", "pdpfl.calibration", "pdpfl.budgets")
    outside = {
        m
        for m in ALL_IMPORTS[name]
        if (m == "pdpfl" or m.startswith("pdpfl.")) and not m.startswith(allowed)
    }
    assert not outside, f"{name} imports {sorted(outside)}"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_torch(name: str) -> None:
    assert not any(m == "torch" or m.startswith("torch.") for m in ALL_IMPORTS[name]), name
