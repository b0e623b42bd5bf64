"""A risk card per budget group: the best membership attack's TPR at FPR 10⁻³, 10⁻², 10⁻¹.

For every budget group (the groups of :func:`~pdpfl.ledger.groups.budget_groups`, as in the
privacy summary) and every observer its ledgers account against, the card bounds the attack on
the group's *most exposed* unit: the mechanism the ledger charges, at the group's largest
sampling rate, largest number of charged rounds and smallest noise multiplier -- a mechanism
less private than every unit of the group, so the card holds for each of them
(:mod:`pdpfl.privacy.risk`: the curve of the accountant's PLD, Kulynych et al. 2024). Groups
whose units sit in ledgers with different mechanisms (e.g. silos with different local steps)
get the pointwise largest TPR of each mechanism's card.

``summary.json["risk"]``, the run's headline, ``pdpfl privacy`` and the model file's metadata
read :func:`risk_cards` (:func:`risk_section` is its JSON form).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from pdpfl.ledger.core import PrivacyLedger
from pdpfl.ledger.groups import budget_groups
from pdpfl.privacy.risk import FPRS, RiskCard, privacy_curve, risk_card

__all__ = ["RISK_SCHEMA", "risk_cards", "risk_section", "run_risk", "unit_risk", "worst_card"]

#: Version of ``summary.json["risk"]``.
RISK_SCHEMA = "pdpfl.risk/1"


def _exposure(
    ledgers: Iterable[PrivacyLedger],
) -> dict[tuple[str, str], list[tuple[Any, float, int, float]]]:
    """(group label, observer) → [(mechanism, largest q, most rounds, smallest σ)], one entry
    per distinct mechanism."""
    out: dict[tuple[str, str], list[tuple[Any, float, int, float]]] = {}
    for ledger in ledgers:
        idx, labels = budget_groups(ledger.budgets)
        for g, label in enumerate(labels):
            rows = np.flatnonzero(idx == g)
            if rows.size == 0:
                continue
            for obs in ledger.observers:
                q = float(ledger.rates[rows].max())
                k = int(ledger.counts[obs][rows].max())
                sigma = float(ledger.noise_multipliers[rows].min())
                entries = out.setdefault((label, obs), [])
                for i, (mech, q0, k0, s0) in enumerate(entries):
                    if mech == ledger.mechanism:
                        entries[i] = (mech, max(q0, q), max(k0, k), min(s0, sigma))
                        break
                else:
                    entries.append((ledger.mechanism, q, k, sigma))
    return out


def risk_cards(
    ledgers: Iterable[PrivacyLedger], fprs: tuple[float, ...] = FPRS
) -> dict[str, dict[str, RiskCard]]:
    """group label → observer → :class:`~pdpfl.privacy.risk.RiskCard` (module docstring)."""
    out: dict[str, dict[str, RiskCard]] = {}
    for (label, obs), entries in _exposure(ledgers).items():
        cards = [
            risk_card(privacy_curve(mech, q, obs, k, noise_multiplier=sigma), obs, fprs)
            for mech, q, k, sigma in entries
        ]
        tprs = tuple(max(c.tprs[i] for c in cards) for i in range(len(fprs)))
        source = "+".join(dict.fromkeys(c.source for c in cards))
        out.setdefault(label, {})[obs] = RiskCard(obs, tuple(fprs), tprs, source)
    return out


def risk_section(
    ledgers: Iterable[PrivacyLedger], unit: str, fprs: tuple[float, ...] = FPRS
) -> dict[str, Any]:
    """``summary.json["risk"]``: per group and observer the bound on any membership attack's
    TPR at each FPR, with a sentence for the largest group (schema :data:`RISK_SCHEMA`)."""
    cards = risk_cards(ledgers, fprs)
    groups = {
        label: {obs: card.to_dict() for obs, card in per.items()} for label, per in cards.items()
    }
    headline = None
    worst: tuple[tuple[float, ...], str, RiskCard] | None = None
    for label, per in cards.items():
        for card in per.values():
            if worst is None or card.tprs > worst[0]:
                worst = (card.tprs, label, card)
    if worst is not None:
        _, label, card = worst
        who = "third parties" if card.observer == "third-party" else "the server"
        headline = f"{card.sentence(unit)} (budget group {label}, seen by {who})"
    return {
        "schema": RISK_SCHEMA,
        "unit": unit,
        "fpr": list(fprs),
        "meaning": (
            "tpr_max: the largest true-positive rate any membership attack on one "
            f"{unit} of the group can reach at each false-positive rate, from the accountant's "
            "privacy-loss distribution (an upper bound; Kulynych et al. 2024), for this run's "
            "charges (earlier runs on the same data, in the lifetime budget store, add to it)"
        ),
        "groups": groups,
        "headline": headline,
    }


def available() -> bool:
    """Whether the risk cards can be computed here: they read the accountant's privacy-loss
    distribution through dp-accounting (the ``pld`` extra); a base install reports ε only."""
    import importlib.util

    return importlib.util.find_spec("dp_accounting") is not None


def run_risk(holders: Iterable[Any], unit: str) -> dict[str, Any] | None:
    """``summary.json["risk"]`` of a run: :func:`risk_section` of the ledgers its parties hold
    (each holder's ``ledger`` attribute: the silos', the server's); None without any (no
    differential privacy, or a coordinator whose silos keep theirs, or a base install without
    the ``pld`` extra, whose privacy-loss distributions the cards are read from)."""
    ledgers = [led for h in holders if isinstance(led := getattr(h, "ledger", None), PrivacyLedger)]
    if not ledgers or not available():
        return None
    return risk_section(ledgers, str(unit))


def unit_risk(
    ledger: PrivacyLedger, unit_id: str, fprs: tuple[float, ...] = FPRS
) -> dict[str, RiskCard]:
    """One unit's own card per observer (its rate, charged rounds and σ), by id (as text)."""
    rows = np.flatnonzero(np.asarray(ledger.ids).astype(str) == str(unit_id))
    out: dict[str, RiskCard] = {}
    for row in rows[:1]:
        for obs in ledger.observers:
            curve = privacy_curve(
                ledger.mechanism,
                float(ledger.rates[row]),
                obs,
                int(ledger.counts[obs][row]),
                noise_multiplier=float(ledger.noise_multipliers[row]),
            )
            out[obs] = risk_card(curve, obs, fprs)
    return out


def worst_card(section: dict[str, Any] | None, fpr: float = 0.01) -> tuple[str, str, float] | None:
    """(group, observer, TPR bound) of the largest TPR at ``fpr`` in ``summary["risk"]``."""
    if not isinstance(section, dict):
        return None
    best: tuple[str, str, float] | None = None
    for label, per in (section.get("groups") or {}).items():
        for obs, card in per.items():
            fprs = list(card.get("fpr") or [])
            if fpr not in fprs:
                continue
            tpr = float(card["tpr_max"][fprs.index(fpr)])
            if best is None or tpr > best[2]:
                best = (str(label), str(obs), tpr)
    return best
