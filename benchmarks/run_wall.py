"""Wall time of `pdpfl run` around its training (issue #26 item 4: wall ≤ training + 2 s).

Run::

    .venv/bin/python benchmarks/run_wall.py --json [--runs 5] [--before /path/to/other/src]

Runs ``pdpfl run examples/heart_disease.yaml --data-dir ../shared/data --quiet --json`` in a
fresh interpreter ``--runs`` times (into temporary folders) and reports, per run, the wall time,
the training time (``summary.json`` ``seconds``, the training loop's own clock) and their
difference (start-up, imports, calibration, outputs, exit). With ``--before SRC`` every run is
paired with one of another checkout's ``src`` (``PYTHONPATH=SRC``, the same interpreter and
packages), interleaved, so both see the same load. Also times rPDP-FL's certified fit for this
example's plan in this process (fresh, then memoized). The load average is recorded per run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "heart_disease.yaml"


def one_run(data_dir: Path, src: str | None) -> dict[str, float]:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = src
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        cmd = [
            sys.executable,
            "-c",
            "from pdpfl.cli import main; main()",
            "run",
            str(CONFIG),
            "--data-dir",
            str(data_dir),
            "--quiet",
            "--json",
            "--out",
            str(out),
        ]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"run failed ({proc.returncode}): {proc.stderr[-2000:]}")
        training = float(json.loads((out / "summary.json").read_text())["seconds"])
    return {
        "wall_s": wall,
        "training_s": training,
        "gap_s": wall - training,
        "load1": os.getloadavg()[0],
    }


def fit_seconds() -> dict[str, float]:
    from pdpfl.calibration.certified import _CACHE, CertifiedEstimator
    from pdpfl.config import load_config
    from pdpfl.fl.rpdp.config import mechanism_spec
    from pdpfl.fl.rpdp.mechanism import mechanism_plan, noise_multiplier

    spec = mechanism_spec(load_config(CONFIG))
    t0 = time.perf_counter()
    sigma = noise_multiplier(spec)
    sigma_s = time.perf_counter() - t0
    plan = mechanism_plan(spec, sigma)
    _CACHE.clear()
    t0 = time.perf_counter()
    CertifiedEstimator.fit(plan, spec.adversary)
    fit_s = time.perf_counter() - t0
    return {"sigma_search_s": sigma_s, "certified_fit_s": fit_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--before", default=None, help="another checkout's src (interleaved)")
    parser.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    args = parser.parse_args()
    after: list[dict[str, float]] = []
    before: list[dict[str, float]] = []
    for _ in range(args.runs):
        if args.before is not None:
            before.append(one_run(args.data_dir, args.before))
        after.append(one_run(args.data_dir, None))
    out: dict[str, object] = {
        "machine": platform.machine(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "runs": after,
        "min_wall_s": min(r["wall_s"] for r in after),
        "min_gap_s": min(r["gap_s"] for r in after),
        **fit_seconds(),
    }
    if before:
        out["before_src"] = args.before
        out["before_runs"] = before
        out["before_min_wall_s"] = min(r["wall_s"] for r in before)
        out["before_min_gap_s"] = min(r["gap_s"] for r in before)
    if args.json:
        print(json.dumps(out))
    else:
        for key, value in out.items():
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
