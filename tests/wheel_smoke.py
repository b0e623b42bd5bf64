"""Smoke test of an installed pdpfl (``make check-wheel``): run it with the Python of a bare
virtual environment that holds only ``torch`` and the built wheel (no extras).

    python tests/wheel_smoke.py --examples examples --data-dir ../shared/data --work DIR

Checked, each through the installed ``pdpfl`` console script (not the source tree):

* every example in ``examples/`` for one round with ``aggregation: plain`` and ``secure``
  (IDP-FedAvg's central variant clips at the aggregator, so its secure run is the distributed
  variant), and ULDP-FL's private weighting and private user sub-sampling (oblivious transfer)
  where the model is a logistic regression; each run made cheap (one round, two local steps or
  one local epoch, at most 20 clients, ULDP-FL's user rate 0.1) -- this checks the install, not
  the accuracy;
* ``pdpfl privacy``, ``pdpfl account`` and ``pdpfl calibrate``;
* each optional extra that is not installed: the feature that needs it exits 2 naming
  ``pip install 'pdpfl[EXTRA]'``, with no traceback and no output folder.

An example whose dataset file is not on disk is skipped, saying so (downloads are disabled with
``PDPFL_NO_DOWNLOAD=1``: no network). Prints one line per check and closes with
``N passed, N failed, N skipped``; exits 1 if any check failed. Standard library only (plus the
installed pdpfl's own dependency PyYAML), so it runs in the bare environment.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml

#: Overrides that make one round cheap, per algorithm family (the example's own name first).
CHEAP: dict[str, list[str]] = {
    "rpdp": ["training.local_steps=2"],
    "prifedsync": ["training.local_steps=2"],
    "idp-fedavg": ["algorithm.local_epochs=1"],
    "uldp": ["algorithm.local_epochs=1", "training.local_steps=2"],
}
#: Examples with more clients run with this many (IDP-FedAvg: at most this many per round).
MAX_CLIENTS = 20
#: Seconds one pdpfl command may take before it is killed (a failed check).
TIMEOUT_S = 600.0
#: The failure a missing dataset gives (with downloads disabled): the example is skipped.
MISSING_DATA = "error: data: dataset file"


@dataclass
class Report:
    """Outcome of every check, printed as it finishes (checks may run in threads)."""

    passed: int = 0
    failed: list[str] = field(default_factory=list)
    skipped: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def check(
        self, name: str, run: Callable[[], str | None], cpu: Callable[[], float] | None = None
    ) -> None:
        t0 = time.perf_counter()
        if cpu is not None:
            cpu()  # reset this thread's count
        try:
            skip, error = run(), ""
        except Exception as err:  # an assertion, a timeout, anything: this check failed
            skip, error = None, f"{type(err).__name__}: {err}"[-3000:]
        status = "FAIL" if error else "SKIP" if skip else "ok"
        note = error or skip or ""
        with self.lock:
            if error:
                self.failed.append(name)
            elif skip:
                self.skipped += 1
            else:
                self.passed += 1
            took = f"{time.perf_counter() - t0:.1f} s" + (f", cpu {cpu():.1f} s" if cpu else "")
            print(f"{status:4} {name} ({took}){': ' + note if note else ''}", flush=True)


class Smoke:
    def __init__(self, pdpfl: Path, work: Path, data_dir: Path | None) -> None:
        self.pdpfl, self.work, self.data_dir = pdpfl, work, data_dir
        self.cpu_s, self.lock, self.mine = 0.0, threading.Lock(), threading.local()
        self.env = {**os.environ, "PDPFL_NO_DOWNLOAD": "1", "PYTHONWARNINGS": "ignore"}
        self.env.pop("PYTHONPATH", None)  # the installed wheel, never a source tree

    def check_cpu_s(self) -> float:
        """CPU seconds of this thread's pdpfl commands since the last call."""
        cpu, self.mine.cpu_s = getattr(self.mine, "cpu_s", 0.0), 0.0
        return cpu

    def pdpfl_cmd(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run ``pdpfl ARGS``; its CPU time (user + system) is added to :attr:`cpu_s`."""
        # each command its own budget store: two runs at once on the same example would
        # otherwise wait for each other's lock on the user's store (and charge it)
        env = {**self.env, "PDPFL_BUDGET_DIR": tempfile.mkdtemp(prefix="budgets-", dir=self.work)}
        with tempfile.TemporaryFile("w+") as out:
            proc = subprocess.Popen(
                [str(self.pdpfl), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
                cwd=self.work,
                stdin=subprocess.DEVNULL,
            )
            timer = threading.Timer(TIMEOUT_S, proc.kill)
            timer.start()
            try:
                _, status, usage = os.wait4(proc.pid, 0)
            finally:
                timer.cancel()
            proc.returncode = os.waitstatus_to_exitcode(status)
            cpu = usage.ru_utime + usage.ru_stime
            self.mine.cpu_s = getattr(self.mine, "cpu_s", 0.0) + cpu  # this thread's check
            with self.lock:
                self.cpu_s += cpu
            out.seek(0)
            return subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), "")

    def ok(self, *args: str) -> str:
        done = self.pdpfl_cmd(*args)
        text = done.stdout + done.stderr
        assert done.returncode == 0, f"exit {done.returncode}: {' '.join(args)}\n{text}"
        assert "Traceback" not in text, text
        return text

    def run_example(self, example: Path, out: Path, overrides: list[str]) -> str | None:
        args = ["run", str(example), "--out", str(out), "--force", "--quiet"]
        if self.data_dir is not None:
            args += ["--data-dir", str(self.data_dir)]
        for item in overrides:
            args += ["--set", item]
        done = self.pdpfl_cmd(*args)
        text = done.stdout + done.stderr
        if done.returncode == 2 and text.startswith(MISSING_DATA) and "not found" in text:
            return "dataset not on disk: " + text.split("(searched")[0].strip()
        assert done.returncode == 0, f"exit {done.returncode}: pdpfl {' '.join(args)}\n{text}"
        assert "Traceback" not in text, text
        assert (out / "summary.json").is_file() and (out / "model.safetensors").is_file()
        return None

    def refused(self, extra: str, args: list[str], out: Path | None = None) -> str | None:
        """``args`` needs ``extra``, which is not installed: exit 2 naming it, nothing written."""
        done = self.pdpfl_cmd(*args)
        text = done.stdout + done.stderr
        assert done.returncode == 2, f"exit {done.returncode}, expected 2: {text}"
        assert text.startswith("error: ") and f"pip install 'pdpfl[{extra}]'" in text, text
        assert "Traceback" not in text, text
        assert out is None or not out.exists(), f"{out} was created"
        return None


def example_runs(example: Path) -> list[tuple[str, list[str]]]:
    """(label, overrides) of every run of one example."""
    raw = yaml.safe_load(example.read_text()) or {}
    section = raw.get("algorithm") or {}
    name, variant = str(section.get("name", "rpdp")), str(section.get("variant", "central"))
    family = "uldp" if name.startswith("uldp") else name
    cheap = ["rounds=1", *CHEAP.get(family, ["training.local_steps=2"])]
    if int((raw.get("data") or {}).get("num_clients") or 0) > MAX_CLIENTS:
        cheap.append(f"data.num_clients={MAX_CLIENTS}")
    if int(section.get("clients_per_round") or 0) > MAX_CLIENTS:
        cheap.append(f"algorithm.clients_per_round={MAX_CLIENTS}")
        # adaptive clipping needs σ < 2σ_b, σ_b = ratio·c: a smaller cohort, a larger ratio
        cheap.append("algorithm.count_noise_ratio=0.2")
    if name in ("uldp-avg", "uldp-sgd"):
        cheap.append("algorithm.user_rate=0.1")  # every sampled user trains a model copy
    secure = ["aggregation=secure"]
    if name == "idp-fedavg" and variant == "central":
        secure.append("algorithm.variant=distributed")  # central clips at the aggregator
    runs = [("plain", [*cheap, "aggregation=plain"]), ("secure", [*cheap, *secure])]
    small_model = (raw.get("model") or {}).get("name") == "logreg"
    if name in ("uldp-avg", "uldp-sgd") and small_model:
        # Paillier encrypts every coordinate of every user's update: a logistic regression in a
        # smoke test, not a CNN (docs/secure_aggregation.md, costs)
        private = [*cheap, "algorithm.weights=private"]
        runs.append(("private-weights", private))
        runs.append(
            (
                "private-subsampling",
                [*private, "algorithm.subsampling=private", "algorithm.user_rate=0.5"],
            )
        )
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=Path, required=True, help="the examples/ folder")
    parser.add_argument("--data-dir", type=Path, default=None, help="dataset files")
    parser.add_argument("--work", type=Path, required=True, help="scratch folder (emptied)")
    parser.add_argument("--only", nargs="*", default=None, help="example stems to run")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once (default 2)")
    args = parser.parse_args(argv)
    pdpfl = Path(sys.executable).parent / "pdpfl"
    if not pdpfl.exists():
        print(f"error: --python: no pdpfl console script next to {sys.executable}")
        return 2
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    data_dir = args.data_dir.resolve() if args.data_dir and args.data_dir.is_dir() else None
    smoke, report = Smoke(pdpfl, args.work.resolve(), data_dir), Report()
    examples = sorted(args.examples.resolve().glob("*.yaml"))
    if args.only:
        examples = [e for e in examples if e.stem in args.only]
    assert examples, f"no examples in {args.examples}"

    def version() -> None:
        import importlib.metadata

        assert smoke.ok("--version").strip() == importlib.metadata.version("pdpfl")
        spec = importlib.util.find_spec("pdpfl")
        assert spec is not None and spec.origin is not None
        assert "site-packages" in spec.origin, f"pdpfl imported from {spec.origin}"

    report.check("pdpfl --version (the installed wheel)", version)
    runs: list[tuple[str, Callable[[], str | None]]] = []
    for example in examples:
        for label, overrides in example_runs(example):
            out = smoke.work / f"{example.stem}-{label}"

            def run(example: Path = example, out: Path = out, o: list[str] = overrides):
                return smoke.run_example(example, out, o)

            runs.append((f"run {example.name} one round, {label}", run))
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:  # each run is its own process
        for name, run in runs:
            pool.submit(report.check, name, run, smoke.check_cpu_s)
    first_run = next((p.parent for p in sorted(smoke.work.glob("*/summary.json"))), None)

    def privacy() -> str | None:
        if first_run is None:
            return "no run finished"
        text = smoke.ok("privacy", str(first_run))
        assert (first_run / "privacy.csv").is_file(), text
        return None

    report.check("pdpfl privacy RUN_DIR", privacy)

    def account() -> None:
        text = smoke.ok(
            "account", "--sigma", "1.1", "--delta", "1e-5", "--q", "0.01", "0.1", "--steps",
            "50", "--rounds", "15", "--client-rate", "0.5", "--adversary", "both", "--json",
        )  # fmt: skip
        assert text.lstrip().startswith("{"), text

    report.check("pdpfl account", account)

    def calibrate() -> None:
        out = smoke.work / "rates.npy"
        smoke.ok(
            "calibrate", "--scenario", "three-levels", "--n", "1000", "--epsilon-max", "10",
            "--delta", "1e-3", "--steps", "20", "--rounds", "15", "--client-rate", "1",
            "--method", "certified", "--out", str(out), "--json",
        )  # fmt: skip
        assert out.is_file()

    report.check("pdpfl calibrate", calibrate)

    demo = args.examples.resolve() / "digits_demo.yaml"
    missing = {m for m in ("flwr", "ray", "dp_accounting") if importlib.util.find_spec(m) is None}
    refusals: list[tuple[str, str, list[str], bool]] = [
        ("flwr", "flower", ["run", str(demo), "--runtime", "flower"], True),
        ("flwr", "flower", ["flower", "superlink", "--insecure", "--dry-run"], False),
        ("ray", "simulation", ["run", str(demo), "--runtime", "flower-simulation"], True),
        ("dp_accounting", "pld", ["run", str(demo), "--set", "privacy.accountant=pld"], True),
        (
            "dp_accounting",
            "pld",
            ["account", "--sigma", "1", "--delta", "1e-5", "--q", "0.1", "--accountant", "pld"],
            False,
        ),  # fmt: skip
    ]
    for module, extra, cmd, makes_out in refusals:
        label = f"without the {extra} extra: pdpfl {' '.join(cmd[:3])} ... exits 2 naming it"

        def refuse(module=module, extra=extra, cmd=cmd, makes_out=makes_out) -> str | None:
            if module not in missing:
                return f"{module} is installed here"
            out = smoke.work / f"refused-{extra}" if makes_out else None
            return smoke.refused(extra, [*cmd, "--out", str(out)] if out else cmd, out)

        report.check(label, refuse)

    print(f"pdpfl commands' CPU time: {smoke.cpu_s:.0f} s (user + system)")
    print(f"{report.passed} passed, {len(report.failed)} failed, {report.skipped} skipped")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
