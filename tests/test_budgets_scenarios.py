"""Preference scenarios, seeded assignment, and budget-file loading."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdpfl.budgets import (
    SCENARIOS,
    BoundedMixGauss,
    BoundedPareto,
    PerLabel,
    Relaxed,
    Strict,
    ThreeLevels,
    UserStudyGroups,
    assign_budgets,
    load_budgets,
    make_scenario,
    validate_budgets,
)
from pdpfl.io import save_npy


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


@pytest.mark.parametrize("name", sorted(set(SCENARIOS) - {"per-label"}))
def test_every_scenario_gives_positive_finite_float64(name: str) -> None:
    eps = assign_budgets(make_scenario(name), 500, rng())
    assert eps.dtype == np.float64 and eps.shape == (500,)
    assert np.all(np.isfinite(eps)) and np.all(eps > 0)


@pytest.mark.parametrize("name", sorted(set(SCENARIOS) - {"per-label"}))
def test_same_seed_same_budgets_other_seed_differs(name: str) -> None:
    a = assign_budgets(make_scenario(name), 300, rng(1))
    b = assign_budgets(make_scenario(name), 300, rng(1))
    np.testing.assert_array_equal(a, b)
    if np.unique(a).size > 1:
        assert not np.array_equal(a, assign_budgets(make_scenario(name), 300, rng(2)))


@given(n=st.integers(1, 2000), seed=st.integers(0, 2**32 - 1))
@settings(max_examples=40)
def test_three_levels_has_exact_shares(n: int, seed: int) -> None:
    eps = ThreeLevels().sample(n, rng(seed))
    counts = np.array([(eps == v).sum() for v in (0.1, 1.0, 5.0)])
    assert counts.sum() == n
    assert np.all(np.abs(counts - np.array([0.7, 0.2, 0.1]) * n) < 1.0)


def test_three_levels_assignment_is_not_in_dataset_order() -> None:
    eps = assign_budgets(ThreeLevels(), 1000, rng(3))
    # Dataset-order assignment would put all 700 strict records first.
    assert not np.all(eps[:700] == 0.1)
    assert (eps[:500] == 0.1).sum() < 450


def test_user_study_shares_and_strict_relaxed() -> None:
    eps = make_scenario("user-study-2", values=[1, 2, 3]).sample(100, rng())
    assert [(eps == v).sum() for v in (1.0, 2.0, 3.0)] == [54, 37, 9]
    eps = make_scenario("user-study-1").sample(100, rng())
    assert [(eps == v).sum() for v in (1.0, 2.0, 3.0)] == [34, 43, 23]
    assert np.all(Strict((1.0, 2.0, 3.0)).sample(5, rng()) == 1.0)
    assert np.all(Relaxed((1.0, 2.0, 3.0)).sample(5, rng()) == 3.0)
    assert UserStudyGroups.study_2().ratios == (0.54, 0.37, 0.09)


def test_bounded_pareto_is_clipped_and_heavy_at_the_lower_end() -> None:
    eps = BoundedPareto().sample(20_000, rng())
    assert eps.min() >= 0.1 and eps.max() <= 10.0
    # P(X <= 2·lower) = 1 − 1/2 for shape 1.
    assert abs(np.mean(eps <= 0.2) - 0.5) < 0.02
    assert np.any(eps == 10.0)


def test_bounded_mix_gauss_second_parameter_is_variance() -> None:
    mix = BoundedMixGauss(weights=(0.0, 1.0, 0.0), bounds=(0.1, 10.0))
    eps = mix.sample(40_000, rng())
    # Component N(1, 0.05): std sqrt(0.05) ≈ 0.224, not 0.05.
    assert abs(eps.std() - np.sqrt(0.05)) < 0.01
    assert abs(eps.mean() - 1.0) < 0.01
    eps = BoundedMixGauss().sample(5000, rng())
    assert eps.min() >= 0.1 and eps.max() <= 10.0


def test_per_label_uses_labels_and_rejects_unknown() -> None:
    labels = np.array([0, 1, 1, 0, 1])
    eps = assign_budgets(make_scenario("per-label"), 5, rng(), labels=labels)
    np.testing.assert_array_equal(eps, [0.5, 0.05, 0.05, 0.5, 0.05])
    custom = make_scenario("per-label", budget_by_label={"3": 2.0, "7": 0.1})
    np.testing.assert_array_equal(custom.for_labels(np.array([7, 3])), [0.1, 2.0])
    with pytest.raises(ValueError, match="label"):
        PerLabel({0: 1.0}).for_labels(np.array([0, 2]))
    with pytest.raises(ValueError, match="labels"):
        assign_budgets(PerLabel(), 3, rng())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"ratios": (0.5, 0.2, 0.1)}, "sum to 1"),
        ({"values": (0.1, -1.0, 5.0)}, "values"),
        ({"values": (0.1, 1.0)}, "expected 3"),
    ],
)
def test_three_levels_rejects_bad_parameters(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ThreeLevels(**kwargs)


def test_make_scenario_unknown_name() -> None:
    with pytest.raises(ValueError, match="unknown name"):
        make_scenario("five-levels")
    with pytest.raises(ValueError, match="bad parameters"):
        make_scenario("bounded-pareto", alpha=2)


@pytest.mark.parametrize(
    ("values", "match"),
    [([], "empty"), ([1.0, 0.0], "<= 0"), ([1.0, np.nan], "NaN"), ([[1.0, 2.0]], "1-D")],
)
def test_validate_budgets_names_the_problem(values: list, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        validate_budgets(np.asarray(values, dtype=float))


def test_load_budgets_npy_and_csv(tmp_path) -> None:
    save_npy(tmp_path / "b.npy", np.array([0.5, 1.0, 2.0]))
    np.testing.assert_array_equal(load_budgets(tmp_path / "b.npy"), [0.5, 1.0, 2.0])
    (tmp_path / "one.csv").write_text("epsilon\n0.5\n1.5\n")
    np.testing.assert_array_equal(load_budgets(tmp_path / "one.csv"), [0.5, 1.5])
    (tmp_path / "bare.csv").write_text("0.5\n1.5\n3\n")
    np.testing.assert_array_equal(load_budgets(tmp_path / "bare.csv"), [0.5, 1.5, 3.0])
    (tmp_path / "table.csv").write_text("id,label,eps\n0,1,0.2\n1,0,4.0\n")
    np.testing.assert_array_equal(load_budgets(tmp_path / "table.csv", column="eps"), [0.2, 4.0])


@pytest.mark.parametrize(
    ("name", "content", "match"),
    [
        ("empty.csv", "", "empty"),
        ("header.csv", "eps\n", "only a header"),
        ("neg.csv", "0.5\n-1\n", "<= 0"),
        ("nan.csv", "0.5\nnan\n", "NaN"),
        ("text.csv", "eps\n0.5\nabc\n", "not a number"),
        ("wide.csv", "a,b\n1,2\n", "2 columns"),
        ("b.txt", "1\n", "unsupported"),
    ],
)
def test_load_budgets_rejects_bad_files(tmp_path, name: str, content: str, match: str) -> None:
    (tmp_path / name).write_text(content)
    with pytest.raises(ValueError, match=match):
        load_budgets(tmp_path / name)


def test_load_budgets_rejects_2d_npy_and_missing_file(tmp_path) -> None:
    save_npy(tmp_path / "m.npy", np.ones((3, 2)))
    with pytest.raises(ValueError, match="1-D"):
        load_budgets(tmp_path / "m.npy")
    with pytest.raises(FileNotFoundError):
        load_budgets(tmp_path / "missing.npy")
