"""Follow the configuration through one run: the files it enters, and the climbs back up a layer.

Issue #21 / #40's measure of how the configuration flows ("from the run entry point: at most 4
climbs back to a higher layer, no file entered more than twice"), taken by running the code
instead of reading it: a tiny in-process run (``runtime.simulation.run_simulation``, or the
CLI's ``pdpfl run`` with ``--from-cli``) under :func:`sys.setprofile`, recording every call of a
pdpfl function that holds the parsed :class:`~pdpfl.config.ExperimentConfig` (a parameter or
local bound to one when the function is entered). A call site that calls the same function
again (a loop over the silos, over the rounds) counts once; consecutive calls in one file are
one *visit* of that file; a *climb* is a visit to a file of a higher layer than the visit
before it (layers: ``tests/test_architecture.py``'s ``LAYERS``, the layering of
CONTRIBUTING.md).

    .venv/bin/python benchmarks/config_walk.py            # from run_simulation
    .venv/bin/python benchmarks/config_walk.py --from-cli # from `pdpfl run`
    .venv/bin/python benchmarks/config_walk.py --build    # the algorithm's build only
    .venv/bin/python benchmarks/config_walk.py --json     # the route as JSON

``--build`` follows the config through ``Algorithm.assemble`` alone (preparation, the
environment and shared checks, the algorithm's own checks, setup, server and silos): the part
where the algorithm's builders used to hand the whole config to shared helpers. It needs no
training, so ``tests/test_config_walk.py`` runs it for the rPDP-FL family.

Only the route matters, not how often a loop walks it: a round loop that hands the config to
the same function every round, or a build that calls the same builder for every silo, is
walked once. A list, dict or set comprehension is part of the function that holds it (as in
CPython 3.12+, which inlines them, PEP 709; on 3.11 each is a frame of its own and counted as
one more entry of its file).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: Frames of comprehensions: not calls in the source (inlined by CPython 3.12+, PEP 709).
COMPREHENSIONS = frozenset({"<listcomp>", "<dictcomp>", "<setcomp>"})
SRC = ROOT / "src"
EXAMPLE = ROOT / "examples" / "digits_demo.yaml"
TINY = ["training.rounds=2", "training.local_steps=2", "data.num_clients=2"]


def _layers() -> dict[str, int]:
    spec = importlib.util.spec_from_file_location("_arch", ROOT / "tests" / "test_architecture.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return dict(module.LAYERS)


def _module(filename: str) -> str | None:
    path = Path(filename)
    try:
        parts = list(path.resolve().relative_to(SRC).with_suffix("").parts)
    except ValueError:
        return None
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) if parts and parts[0] == "pdpfl" else None


def record(call: Callable[[], object]) -> list[str]:
    """The modules entered with the config while ``call()`` runs, in order (consecutive
    repeats collapsed)."""
    from pdpfl.config import ExperimentConfig

    route: list[str] = []
    modules: dict[str, str | None] = {}
    seen: set[tuple[Any, Any]] = set()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        name = frame.f_code.co_filename
        module = modules.get(name, "?")
        if module == "?":
            module = modules[name] = _module(name)
        if module is None or module.startswith("pdpfl.config"):
            return  # the config's own methods are not a step of the route
        if frame.f_code.co_name in COMPREHENSIONS:
            return  # part of the enclosing function
        if any(isinstance(v, ExperimentConfig) for v in frame.f_locals.values()):
            caller = frame.f_back.f_code if frame.f_back is not None else None
            if (caller, frame.f_code) in seen:
                return  # the same call site again (a loop): walked once
            seen.add((caller, frame.f_code))
            if not route or route[-1] != module:
                route.append(module)

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return route


def walk_build(overrides: Sequence[str] = ()) -> list[str]:
    """The route through ``Algorithm.assemble`` alone, for the example (plus ``overrides``)."""
    from pdpfl.config import load_config
    from pdpfl.fl.algorithm import as_algorithm
    from pdpfl.runtime.simulation import load_federation_for

    config = load_config(EXAMPLE, [*TINY, *overrides])
    federation = load_federation_for(config)
    return record(lambda: as_algorithm(config.algorithm).assemble(config, federation, pooled=True))


def walk(from_cli: bool = False) -> list[str]:
    """The modules entered with the config during a tiny run, in order."""
    from pdpfl.config import load_config

    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "run")
        if from_cli:
            from typer.testing import CliRunner

            from pdpfl.cli import app

            args = ["run", str(EXAMPLE), "--set", f"output_dir={out}", "--quiet"]
            args += [a for t in TINY for a in ("--set", t)]
            results = []
            route = record(lambda: results.append(CliRunner().invoke(app, args)))
            if results[0].exit_code != 0:
                raise SystemExit(results[0].output)
            return route
        from pdpfl.runtime.simulation import run_simulation

        config = load_config(EXAMPLE, [*TINY, f"output_dir={out}"])
        return record(lambda: run_simulation(config, out, progress=False))


def measure(route: list[str]) -> dict[str, Any]:
    """Files (by module), their visits, and the climbs between consecutive visits."""
    layers = _layers()

    def layer(module: str) -> int:
        parts = module.split(".")
        return layers[parts[1] if len(parts) > 1 else "__init__"]

    files = [m for m in route]
    visits: dict[str, int] = {}
    for m in files:
        visits[m] = visits.get(m, 0) + 1
    climbs = [
        f"{a} ({layer(a)}) -> {b} ({layer(b)})"
        for a, b in zip(files, files[1:], strict=False)
        if layer(b) > layer(a)
    ]
    return {
        "route": [f"{m} ({layer(m)})" for m in files],
        "climbs": climbs,
        "entered_more_than_twice": {m: n for m, n in visits.items() if n > 2},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from-cli", action="store_true", help="start at `pdpfl run`")
    parser.add_argument("--build", action="store_true", help="only the algorithm's assemble")
    parser.add_argument("--json", action="store_true", help="print the route as JSON")
    args = parser.parse_args()
    result = measure(walk_build() if args.build else walk(from_cli=args.from_cli))
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print("route (layer):")
    for step in result["route"]:
        print(f"  {step}")
    print(f"climbs back to a higher layer: {len(result['climbs'])}")
    for climb in result["climbs"]:
        print(f"  {climb}")
    more = result["entered_more_than_twice"]
    print(f"files entered more than twice: {len(more)} {more or ''}")


if __name__ == "__main__":
    main()
