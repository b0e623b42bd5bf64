"""Server optimizers: FedAvgM, FedAdam and FedYogi as post-processing of the released aggregate.

Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar, McMahan, "Adaptive Federated
Optimization", ICLR 2021, Algorithm 2 (FedOpt). Each round the algorithm's own server step
(:meth:`pdpfl.fl.api.ServerAlgorithm.aggregate`) proposes the next global model x̂_{t+1} from
the round's released aggregate; the *pseudo-gradient* is the negative of the proposed move,

    Δ_t = x̂_{t+1} − x_t                       (Algorithm 2, line 8: the average client change),

and the server optimizer replaces x̂_{t+1} by (element-wise, m_{−1} = 0, v_{−1} = τ²):

* **FedAvgM** (server momentum; Hsu et al. 2019, Reddi et al. §3):
  m_t = β₁ m_{t−1} + Δ_t,  x_{t+1} = x_t + η m_t  (β₁ = 0, η = 1: the algorithm's own step);
* **FedAdam** (Algorithm 2, lines 9-11):
  m_t = β₁ m_{t−1} + (1 − β₁) Δ_t,  v_t = β₂ v_{t−1} + (1 − β₂) Δ_t²,
  x_{t+1} = x_t + η m_t / (√v_t + τ);
* **FedYogi** (Algorithm 2, line 10'): as FedAdam with
  v_t = v_{t−1} − (1 − β₂) Δ_t² sign(v_{t−1} − Δ_t²).

Privacy: x_t and x̂_{t+1} are released global models (the mechanism's output), and the state
(m, v) is a function of earlier released models only. The optimizer is therefore
post-processing of what the ledgers already charge: it never touches a silo, a ledger or a
sampling decision, and every ε is unchanged (``tests/test_server_optimizer.py`` checks the
ledgers and privacy summaries of runs with and without it are equal).

Every round takes a step, including one whose aggregate is empty (Δ_t = 0: the momentum
still moves the model, as a momentum method does with a zero gradient). The state is part of
the round loop's checkpoint (:func:`pdpfl.runtime.loop.run_rounds`), so a resumed run continues
exactly. Arithmetic is float64; the model is returned as float32, as every server step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from pdpfl.fl.api import Params

if TYPE_CHECKING:
    from pdpfl.config.sections import ServerOptimizerConfig

__all__ = ["METHODS", "ServerOptimizer", "ServerOptimizerSpec"]

#: The server optimizers (``server_optimizer.name``), ``none`` aside.
METHODS: tuple[str, ...] = ("fedavgm", "fedadam", "fedyogi")


@dataclass(frozen=True)
class ServerOptimizerSpec:
    """The public hyper-parameters of a server optimizer (Reddi et al. 2021, Algorithm 2)."""

    name: str
    eta: float
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3

    def __post_init__(self) -> None:
        if self.name not in METHODS:
            raise ValueError(
                f"server_optimizer.name: expected one of {', '.join(METHODS)}, got {self.name!r}"
            )
        for field, value, low, high in (
            ("eta", self.eta, 0.0, np.inf),
            ("tau", self.tau, 0.0, np.inf),
        ):
            if not (np.isfinite(value) and low < value < high):
                raise ValueError(f"server_optimizer.{field}: must be a finite number > 0")
        for field, value in (("beta1", self.beta1), ("beta2", self.beta2)):
            if not (0.0 <= value < 1.0):
                raise ValueError(f"server_optimizer.{field}: must be in [0, 1), got {value}")

    @classmethod
    def from_config(cls, section: ServerOptimizerConfig | None) -> ServerOptimizerSpec | None:
        """The spec of a ``server_optimizer:`` section (None for ``name: none`` or no section)."""
        if section is None or getattr(section, "name", "none") == "none":
            return None
        return cls(
            name=str(section.name),
            eta=float(section.server_lr()),
            beta1=float(section.beta1),
            beta2=float(section.beta2),
            tau=float(section.tau),
        )

    def build(self) -> ServerOptimizer:
        return ServerOptimizer(self)


class ServerOptimizer:
    """The state (m, v, steps) of one server optimizer and its step (see the module doc).

    :meth:`step` is pure: it returns the next model and the state after the step, and
    :meth:`commit` adopts that state, so a round whose model turns out non-finite (nothing is
    published) leaves the optimizer as it was.
    """

    def __init__(self, spec: ServerOptimizerSpec) -> None:
        self.spec = spec
        self.m: list[np.ndarray] | None = None
        self.v: list[np.ndarray] | None = None
        self.steps = 0

    def step(self, params: Params, proposed: Params) -> tuple[Params, dict[str, Any]]:
        """x_{t+1} from x_t = ``params`` and the algorithm's x̂_{t+1} = ``proposed``; returns
        the model and the state after this step (not yet adopted: :meth:`commit`)."""
        s = self.spec
        x = [np.asarray(p, dtype=np.float64) for p in params]
        delta = [
            np.asarray(q, dtype=np.float64) - base for q, base in zip(proposed, x, strict=True)
        ]
        m_prev = self.m if self.m is not None else [np.zeros_like(d) for d in delta]
        v_prev = self.v if self.v is not None else [np.full_like(d, s.tau * s.tau) for d in delta]
        if len(m_prev) != len(delta) or any(
            a.shape != d.shape for a, d in zip(m_prev, delta, strict=True)
        ):
            raise ValueError("server_optimizer: the model's shapes changed between rounds")
        if s.name == "fedavgm":
            m = [s.beta1 * mp + d for mp, d in zip(m_prev, delta, strict=True)]
            v = v_prev
            new = [base + s.eta * mt for base, mt in zip(x, m, strict=True)]
        else:
            m = [s.beta1 * mp + (1.0 - s.beta1) * d for mp, d in zip(m_prev, delta, strict=True)]
            if s.name == "fedadam":
                v = [
                    s.beta2 * vp + (1.0 - s.beta2) * d * d
                    for vp, d in zip(v_prev, delta, strict=True)
                ]
            else:  # fedyogi
                v = [
                    vp - (1.0 - s.beta2) * d * d * np.sign(vp - d * d)
                    for vp, d in zip(v_prev, delta, strict=True)
                ]
            new = [
                base + s.eta * mt / (np.sqrt(vt) + s.tau)
                for base, mt, vt in zip(x, m, v, strict=True)
            ]
        out: Params = [n.astype(np.float32) for n in new]
        return out, {"m": m, "v": v, "steps": self.steps + 1}

    def commit(self, state: dict[str, Any]) -> None:
        """Adopt the state a :meth:`step` returned."""
        self.m = [np.asarray(a, dtype=np.float64) for a in state["m"]]
        self.v = [np.asarray(a, dtype=np.float64) for a in state["v"]]
        self.steps = int(state["steps"])

    def apply(self, params: Params, proposed: Params) -> Params:
        """:meth:`step` and :meth:`commit` in one call."""
        new, state = self.step(params, proposed)
        self.commit(state)
        return new

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict[str, Any]:
        """The optimizer's state for the round loop's checkpoint (arrays and a count)."""
        return {
            "name": self.spec.name,
            "steps": int(self.steps),
            "m": [a.copy() for a in self.m] if self.m is not None else [],
            "v": [a.copy() for a in self.v] if self.v is not None else [],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict` (a state of another optimizer is refused)."""
        if str(state.get("name")) != self.spec.name:
            raise ValueError(
                f"server_optimizer: the checkpoint holds {state.get('name')!r} state, the run "
                f"configures {self.spec.name!r}"
            )
        steps = int(state["steps"])
        m = [np.asarray(a, dtype=np.float64) for a in state["m"]]
        v = [np.asarray(a, dtype=np.float64) for a in state["v"]]
        if steps and (not m or len(m) != len(v)):
            raise ValueError("server_optimizer: the checkpoint's optimizer state is incomplete")
        self.steps = steps
        self.m = m or None
        self.v = v or None
