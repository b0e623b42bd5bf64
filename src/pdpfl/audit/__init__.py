"""Empirical privacy audits per budget group (``pdpfl audit CONFIG``).

One-run auditing (Steinke, Nasr & Jagielski, NeurIPS 2023) in its federated form (Andrew et
al., ICLR 2024): m white-box Dirac canaries per budget group, each included with probability ½,
trained once through the real mechanism; every observer's view is turned into a lower bound ε̂
on each group's ε at a stated confidence -- Steinke et al.'s and the f-DP audit of Mahloujifar,
Melis & Chaudhuri (ICML 2025), the larger one reported -- beside the accountant's ε and its
risk card. ε̂ above the accountant's ε is a found privacy bug; a test that saturated where it
could not have failed is reported inconclusive.

* :mod:`~pdpfl.audit.bound` -- Steinke et al.'s test (correct guesses → ε̂);
* :mod:`~pdpfl.audit.fdp` -- the f-DP test and the group's own mechanism family;
* :mod:`~pdpfl.audit.evidence` -- the guess ladder, both statistics, the verdict, the one-shot
  estimate and the measured attack rates of one group;
* :mod:`~pdpfl.audit.canaries` -- the canary plan (coins, coordinates, hosts, control group);
* :mod:`~pdpfl.audit.space` -- the model's coordinates or an audit-only block;
* :mod:`~pdpfl.audit.hooks` -- the per-algorithm hook that plants canaries (records of the
  DP-FedAvg family there; clients of IDP-FedAvg: :mod:`~pdpfl.audit.client_canaries`; users of
  ULDP-AVG/SGD: :mod:`~pdpfl.audit.user_canaries`; PriFedSync's records:
  :mod:`~pdpfl.audit.prifedsync_canaries`);
* :mod:`~pdpfl.audit.observe` -- what each observer sees, round by round (the canaries' scores);
* :mod:`~pdpfl.audit.session` -- one audit run; :mod:`~pdpfl.audit.report` -- its outputs.
* :mod:`~pdpfl.audit.ceiling` -- what ideal canaries of a group's mechanism would certify
  with the same statistics (the one-run ceiling a measured ε̂ is read against).

::

    from pdpfl.audit import AuditSettings, run_audit
    result = run_audit(config, AuditSettings(canaries=500), out_dir="runs/audit")
    result.verdict               # "consistent", "violation" or "inconclusive (saturated)"
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pdpfl.audit import client_canaries as _client_canaries  # noqa: F401 (registers)
from pdpfl.audit import idp_sgd_canaries as _idp_sgd_canaries  # noqa: F401 (registers)
from pdpfl.audit import prifedsync_canaries as _prifedsync_canaries  # noqa: F401 (registers)
from pdpfl.audit import user_canaries as _user_canaries  # noqa: F401 (registers)
from pdpfl.audit.bound import AuditBound, audit_scores, epsilon_lower_bound, p_value
from pdpfl.audit.evidence import Evidence, evidence, guess_ladder
from pdpfl.audit.hooks import (
    AuditUnsupported,
    CanaryHook,
    RecordCanaries,
    canary_hook,
    register_canary_hook,
)
from pdpfl.audit.report import AUDIT_OUTPUTS, write_audit
from pdpfl.audit.session import AuditResult, AuditSession, AuditSettings

if TYPE_CHECKING:
    from pdpfl.config import ExperimentConfig
    from pdpfl.data.federation import Federation

__all__ = [
    "AUDIT_OUTPUTS",
    "AuditBound",
    "AuditResult",
    "AuditSession",
    "AuditSettings",
    "AuditUnsupported",
    "CanaryHook",
    "Evidence",
    "RecordCanaries",
    "audit_scores",
    "canary_hook",
    "epsilon_lower_bound",
    "evidence",
    "guess_ladder",
    "p_value",
    "register_canary_hook",
    "run_audit",
]


def run_audit(
    config: ExperimentConfig,
    settings: AuditSettings | None = None,
    out_dir: str | Path | None = None,
    *,
    federation: Federation | None = None,
    progress: bool = False,
) -> AuditResult:
    """Audit ``config`` once; write ``audit.json``/``audit.png``/``AUDIT.md`` to ``out_dir``
    (when given; the folder must be checked by the caller) and return the result."""
    result = AuditSession.create(config, settings, federation=federation).execute(progress=progress)
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        write_audit(result.to_dict(), out)
    return result
