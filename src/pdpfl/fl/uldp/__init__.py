"""ULDP-FL: user-level DP when one person's records sit in several silos (Kato et al., PVLDB 2024).

The privacy unit is a *user*: all of one person's records in every silo (add/remove one user,
Def. 1 of §3). Users are linked across silos by a global id ``0 .. |U|-1``; ``|U|`` is the
public, configured number of users (``data.options.num_users``). Every silo takes part in every
round. The paper's formulas were lost in extraction; they are restated, with the reference
code's bugs D1-D29 and how pdpfl treats each, in ``docs/uldp_spec.md`` (Part A), which the
docstrings here cite as "spec".

* :mod:`~pdpfl.fl.uldp.config` -- the variants as registered config sections (``uldp-naive``,
  ``uldp-group``, ``uldp-avg``, ``uldp-sgd``, ``uldp-default``); :mod:`~pdpfl.fl.uldp.methods`
  -- their ``compare`` methods;
* :mod:`~pdpfl.fl.uldp.mechanism` -- the published setups (frozen dataclasses) and the
  server's user-level mechanism (:class:`~pdpfl.privacy.uldp.UserLevelPlan`, σ from ε_max,
  personal budgets → q_u);
* :mod:`~pdpfl.fl.uldp.weights` -- uniform/enhanced weights (Eq. 4), GROUP flags;
* :mod:`~pdpfl.fl.uldp.silo` / :mod:`~pdpfl.fl.uldp.users` -- the silos on the template
  (NAIVE, DEFAULT, GROUP; AVG, SGD), which keep no ledger;
* :mod:`~pdpfl.fl.uldp.server` -- the global steps, user sampling and the one user-level
  ledger (unit ``user``), charged when the server decides a round.

Accounting (pure numpy, :mod:`pdpfl.privacy.uldp`): :func:`user_epsilon` (Theorems 3/5),
:func:`group_epsilon` (Theorem 4), the orders :data:`ORDERS` / :data:`OPACUS_ORDERS`. Exact
discrete noise: AVG/SGD's shares (``privacy.noise_shares: discrete``,
:mod:`~pdpfl.fl.uldp.discrete`, :mod:`pdpfl.privacy.uldp_discrete`); NAIVE's silo noise and
GROUP's DP-SGD steps (``privacy.central_noise: discrete``, :mod:`pdpfl.privacy.uldp_central`).
"""

from pdpfl.fl.uldp.config import (
    UldpAvgConfig,
    UldpConfig,
    UldpDefaultConfig,
    UldpGroupConfig,
    UldpNaiveConfig,
    UldpSgdConfig,
    UserLevelConfig,
)
from pdpfl.fl.uldp.mechanism import (
    GroupSetup,
    UldpSetup,
    UserLevelSetup,
    decode_mask,
    encode_mask,
    noise_multiplier,
    num_users,
    user_budgets,
)
from pdpfl.fl.uldp.server import (
    AvgServer,
    DefaultServer,
    GroupServer,
    LedgerServer,
    NaiveServer,
    SamplingServer,
    SgdServer,
    UldpServer,
)
from pdpfl.fl.uldp.silo import DefaultSilo, GroupSilo, NaiveSilo, SiloLevelSilo, UldpSilo
from pdpfl.fl.uldp.users import AvgSilo, SgdSilo, UserLevelSilo
from pdpfl.fl.uldp.weights import (
    check_weights,
    enhanced_weights,
    fair_group_quotas,
    resolve_group_k,
    split_group_quotas,
    uniform_weights,
)
from pdpfl.privacy.uldp import (
    OPACUS_ORDERS,
    ORDERS,
    UserLevelPlan,
    group_epsilon,
    group_orders,
    user_epsilon,
)

__all__ = [
    "OPACUS_ORDERS",
    "ORDERS",
    "AvgServer",
    "AvgSilo",
    "DefaultServer",
    "DefaultSilo",
    "GroupServer",
    "GroupSetup",
    "GroupSilo",
    "LedgerServer",
    "NaiveServer",
    "NaiveSilo",
    "SamplingServer",
    "SgdServer",
    "SgdSilo",
    "SiloLevelSilo",
    "UldpAvgConfig",
    "UldpConfig",
    "UldpDefaultConfig",
    "UldpGroupConfig",
    "UldpNaiveConfig",
    "UldpServer",
    "UldpSetup",
    "UldpSgdConfig",
    "UldpSilo",
    "UserLevelConfig",
    "UserLevelPlan",
    "UserLevelSetup",
    "UserLevelSilo",
    "check_weights",
    "decode_mask",
    "encode_mask",
    "enhanced_weights",
    "fair_group_quotas",
    "group_epsilon",
    "group_orders",
    "noise_multiplier",
    "num_users",
    "resolve_group_k",
    "split_group_quotas",
    "uniform_weights",
    "user_budgets",
    "user_epsilon",
]
