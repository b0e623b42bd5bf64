"""Benchmark: the hardened config reader on hostile YAML, and the data checks' cost.

* **Config reader** (:mod:`pdpfl.safe_yaml`): seconds to refuse each hostile document (billion
  laughs, 256 KiB of keys, deep nesting, a huge scalar, a 5000-digit integer) next to the time
  to read ``examples/heart_disease.yaml`` with the hardened reader and with PyYAML's
  ``safe_load`` (the reference: what pdpfl used before). The goal is "an error within a second
  or two"; before, billion laughs did not finish in 60 s (PyYAML builds shared lists, then the
  config's deep copy expanded them) and a 5000-digit integer ended in a traceback.
* **Data checks** (:mod:`pdpfl.data.validation`): ``check_features`` + ``check_labels`` +
  ``check_record_ids`` on MNIST-sized arrays (60,000 × 784 float32) as a ratio to one float64
  copy of the features (what the loaders did anyway).

Usage: ``python benchmarks/validation.py --json [--repeats 5]``
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import yaml

from pdpfl.data.validation import check_features, check_labels, check_record_ids
from pdpfl.safe_yaml import MAX_BYTES, YamlError, load_yaml_text

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "heart_disease.yaml"


def _laughs(levels: int = 9) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


HOSTILE = {
    "billion_laughs": _laughs(),
    "256KiB_of_keys": "".join(f"k{i}: {i}\n" for i in range(30_000))[:MAX_BYTES],
    "nested_10000": "a: " + "[" * 10_000 + "]" * 10_000 + "\n",
    "scalar_250KiB": "a: '" + "x" * (MAX_BYTES - 10) + "'\n",
    "int_5000_digits": "seed: " + "9" * 5000 + "\n",
    "duplicate_key": "seed: 1\n" * 2,
}


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _refuse(text: str) -> str:
    try:
        load_yaml_text(text, "bench")
    except YamlError as err:
        return "refused: " + str(err)[:80]
    return "accepted"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    clean = EXAMPLE.read_text()
    out: dict[str, object] = {
        "clean_example_s": {
            "pdpfl": _best(lambda: load_yaml_text(clean), args.repeats),
            "pyyaml_safe_load": _best(lambda: yaml.safe_load(clean), args.repeats),
        }
    }
    hostile = {}
    for name, text in HOSTILE.items():
        hostile[name] = {
            "seconds": _best(lambda t=text: _refuse(t), args.repeats),
            "result": _refuse(text),
        }
    out["hostile"] = hostile

    rng = np.random.default_rng(0)
    x = rng.random((60_000, 784), dtype=np.float32)
    y = rng.integers(0, 10, 60_000)
    ids = rng.permutation(60_000)
    copy = _best(lambda: x.astype(np.float64), args.repeats)
    checks = _best(
        lambda: (check_features(x), check_labels(y), check_record_ids(ids)), args.repeats
    )
    out["data_checks_mnist_60k"] = {
        "checks_s": checks,
        "float64_copy_s": copy,
        "ratio": checks / copy,
    }
    print(json.dumps(out, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
