"""ULDP-FL's ``pdpfl compare --methods`` (the paper's variants: DEFAULT, GROUP-k, AVG/SGD with
enhanced weights, user sub-sampling and personal budgets), registered on import."""

from __future__ import annotations

from pdpfl.config import METHODS, MethodSpec

_ENHANCED = ["algorithm.weights=enhanced", "data.public_user_histograms=true"]


def _rate(arg: str | None) -> list[str]:
    return [] if arg is None else [f"algorithm.user_rate={arg}"]


def _group(arg: str | None) -> list[str]:
    out = ["algorithm.name=uldp-group"]
    if arg is None:
        return out
    out.append(f"algorithm.group_k={arg}")
    if arg in ("max", "median"):
        out += ["algorithm.group_flags=fair", "data.public_user_histograms=true"]
    return out


for _name, _help, _over, _arg in (
    (
        "default",
        "DEFAULT: FedAvg with two-sided learning rates, no DP",
        lambda a: ["algorithm.name=uldp-default"],
        False,
    ),
    ("uldp-group", "ULDP-GROUP-k (uldp-group:K with K an integer, max or median)", _group, True),
    (
        "uldp-avg-w",
        "ULDP-AVG with enhanced weights (discloses the histograms to the server)",
        lambda a: ["algorithm.name=uldp-avg", *_ENHANCED],
        False,
    ),
    (
        "uldp-sgd-w",
        "ULDP-SGD with enhanced weights (discloses the histograms to the server)",
        lambda a: ["algorithm.name=uldp-sgd", *_ENHANCED],
        False,
    ),
    (
        "uldp-avg-s",
        "ULDP-AVG with user sub-sampling q = ARG",
        lambda a: ["algorithm.name=uldp-avg", *_rate(a)],
        True,
    ),
    (
        "uldp-avg-ws",
        "ULDP-AVG-w with user sub-sampling q = ARG",
        lambda a: ["algorithm.name=uldp-avg", *_ENHANCED, *_rate(a)],
        True,
    ),
    (
        "uldp-sgd-s",
        "ULDP-SGD with user sub-sampling q = ARG",
        lambda a: ["algorithm.name=uldp-sgd", *_rate(a)],
        True,
    ),
    (
        "uldp-sgd-ws",
        "ULDP-SGD-w with user sub-sampling q = ARG",
        lambda a: ["algorithm.name=uldp-sgd", *_ENHANCED, *_rate(a)],
        True,
    ),
    (
        "puldp-avg-w",
        "ULDP-AVG-w with personal budgets per user (budgets section; per-user "
        "rates q_u from the certified calibrator)",
        lambda a: ["algorithm.name=uldp-avg", *_ENHANCED, "algorithm.personal_budgets=true"],
        False,
    ),
    (
        "puldp-avg",
        "ULDP-AVG (uniform weights) with personal budgets per user",
        lambda a: ["algorithm.name=uldp-avg", "algorithm.personal_budgets=true"],
        False,
    ),
):
    METHODS.register(_name, MethodSpec(_name, _over, _help, takes_argument=_arg), replace=True)
