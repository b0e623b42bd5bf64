"""Personal privacy budgets: the papers' preference scenarios, seeded, plus file loading.

Every scenario draws ε values (float64, all > 0) from a :class:`numpy.random.Generator`
supplied by the caller (derive it from the run's seed with :func:`pdpfl.seeding.numpy_generator`),
so a budget assignment is reproducible from one config seed.

Scenarios
---------
* :class:`ThreeLevels` -- rPDP-FL §7 "ThreeLevels": a few discrete categories with given shares
  (default 70 % / 20 % / 10 % over ε = 0.1 / 1.0 / 5.0; the paper uses 1 / 3 / 10 on CIFAR-10).
* :class:`BoundedPareto` -- rPDP-FL §7 "BoundedPareto": Pareto (type I, scale ``lower``) clipped to
  ``[lower, upper]`` (default shape 1, [0.1, 10]).
* :class:`BoundedMixGauss` -- rPDP-FL §7 "BoundedMixGauss": mixture of three Gaussians clipped to
  ``bounds``. **Variance convention**: as in the paper's notation N(μ, σ²), the second
  parameter is the *variance*; the default N(0.1, 0.01), N(1, 0.05), N(5, 0.5) therefore has
  standard deviations 0.1, 0.224 and 0.707.
* :class:`UserStudyGroups`, :class:`Strict`, :class:`Relaxed` -- IDP-FedAvg §V (after Boenisch et
  al.): client-level privacy groups with user-study shares 34/43/23 % and 54/37/9 %, and the
  all-strictest / all-most-relaxed settings.
* :class:`PerLabel` -- data-dependent budgets (rPDP-FL Appendix A): ε chosen by class label.
* :class:`Uniform` -- one ε for everyone.

Discrete scenarios assign *exact* shares (largest-remainder rounding) and then shuffle, so
``ThreeLevels().sample(1000, rng)`` has exactly 700 / 200 / 100 records per level, placed by a
seeded random permutation -- never in dataset order, which would couple budgets to data layout.
"""

from pdpfl.budgets.assign import assign_budgets, make_scenario, public_statistics
from pdpfl.budgets.files import load_budgets
from pdpfl.budgets.scenarios import (
    HEART_DISEASE_BUDGETS,
    MIN_BUDGET,
    SCENARIOS,
    BoundedMixGauss,
    BoundedPareto,
    BudgetScenario,
    PerLabel,
    Relaxed,
    Strict,
    ThreeLevels,
    Uniform,
    UserStudyGroups,
    below_minimum,
    validate_budgets,
)

__all__ = [
    "MIN_BUDGET",
    "below_minimum",
    "BudgetScenario",
    "ThreeLevels",
    "BoundedPareto",
    "BoundedMixGauss",
    "UserStudyGroups",
    "Strict",
    "Relaxed",
    "PerLabel",
    "Uniform",
    "SCENARIOS",
    "make_scenario",
    "assign_budgets",
    "load_budgets",
    "validate_budgets",
    "public_statistics",
    "HEART_DISEASE_BUDGETS",
]
