"""``gdp-clt``: the central-limit μ-GDP accountant (an approximation, labelled as such).

Gaussian DP (Dong, Roth & Su 2022) composes exactly: μ-GDP mechanisms compose to √Σμ_i²-GDP
(Cor. 3.3). Subsampled Gaussian steps are not μ-GDP for any useful μ, but their composition
tends to μ-GDP (the central limit theorems; Dong et al. Cor. 5.4), with per-step contributions

* ``PoissonSampled(q, GaussianMechanism(σ))``: μ² = q²·(e^{1/σ²} − 1) per step
  (Bu, Dong, Long & Su 2020: μ = q·√(T(e^{1/σ²} − 1)));
* ``SampledWithoutReplacement(γ, GaussianMechanism(σ))`` (σ relative to the replace-one
  sensitivity): μ² = 2γ²·(e^{σ⁻²}Φ(1.5/σ) + 3Φ(−0.5/σ) − 2) per step (PriFedSync Theorem 2:
  μ_j = √2·c_j·√(…), c_j = (B/n)·√(K·R));
* ``GaussianMechanism(σ)``: exactly (1/σ)-GDP;

``Composed`` multiplies the steps, ``Sequence`` adds μ². ε at δ is the exact μ-GDP conversion
(:func:`pdpfl.privacy.gdp.gdp_epsilon`, Cor. 2.13).

**Not an upper bound**: the CLT is a limit as the number of steps grows; for finitely many steps
it can under-report ε (markedly for few steps or large rates). :attr:`GdpCltAccountant.approximate`
is True so that every report can label the figure; the rigorous numbers come from ``rdp`` (or
``pld``). Client sampling (``TwoStageRound``) and group events are not supported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from numpy.typing import ArrayLike

from pdpfl.privacy.gdp import gdp_epsilon, poisson_gaussian_mu_clt, prifedsync_mu
from pdpfl.privacy.mechanisms import (
    Composed,
    GaussianMechanism,
    Mechanism,
    PoissonSampled,
    SampledWithoutReplacement,
    Sequence,
    is_mechanism,
    outline,
)
from pdpfl.privacy.registry import UnsupportedEventError, check_counts, register_accountant

__all__ = ["GdpCltAccountant"]


@dataclass(frozen=True)
class _Mu:
    """An event compiled for the CLT accountant: μ per row as a function of the repetitions,
    and the row counts of its parts (1: no per-record rates)."""

    mu: Callable[[np.ndarray], np.ndarray]
    rows: frozenset[int]


class GdpCltAccountant:
    """Central-limit μ-GDP accountant (module docstring); ``detail`` is μ."""

    name = "gdp-clt"
    #: A central-limit approximation, not an upper bound: reports must label it.
    approximate: ClassVar[bool] = True

    def __repr__(self) -> str:
        return "GdpCltAccountant()"

    def _compile(self, event: Mechanism) -> _Mu:
        """The one traversal of ``event``: a function from repetitions to μ per row, and the
        row counts of its parts; UnsupportedEventError naming what it cannot interpret."""
        if isinstance(event, Composed):
            inner, n = self._compile(event.inner), event.count
            return _Mu(lambda steps: inner.mu(steps * n), inner.rows)
        if isinstance(event, Sequence):
            parts = [self._compile(e) for e in event.events]
            return _Mu(
                lambda steps: np.sqrt(
                    np.sum(np.square(np.broadcast_arrays(*[p.mu(steps) for p in parts])), axis=0)
                ),
                frozenset().union(*(p.rows for p in parts)),
            )
        if isinstance(event, GaussianMechanism):
            sigma = event.noise_multiplier
            return _Mu(lambda steps: np.sqrt(steps.astype(np.float64)) / sigma, frozenset({1}))
        if isinstance(event, PoissonSampled | SampledWithoutReplacement) and isinstance(
            event.inner, GaussianMechanism
        ):
            q, sigma = event.rates, event.inner.noise_multiplier
            if isinstance(event, PoissonSampled):
                # Bu et al.: q·√(T·(e^{1/σ²} − 1)), the formula's own float operations
                def poisson(steps: np.ndarray) -> np.ndarray:
                    t = steps.astype(np.float64)
                    return np.asarray(poisson_gaussian_mu_clt(q, sigma, t), dtype=np.float64)

                return _Mu(poisson, frozenset({int(q.size)}))

            # PriFedSync Theorem 2 with B/n = γ (n = 1) and K·R = T steps
            def wor(steps: np.ndarray) -> np.ndarray:
                t = steps.astype(np.float64)
                return np.asarray(prifedsync_mu(sigma, q, 1.0, t, 1), dtype=np.float64)

            return _Mu(wor, frozenset({int(q.size)}))
        what = outline(event) if is_mechanism(event) else type(event).__name__
        raise UnsupportedEventError(
            f"GdpCltAccountant cannot interpret {what}: supported are GaussianMechanism, "
            "PoissonSampled / SampledWithoutReplacement around a GaussianMechanism, Composed "
            "and Sequence of those"
        )

    def supports(self, event: Mechanism) -> bool:
        """True if ``event`` compiles: Gaussian, Poisson / without-replacement sampled
        Gaussians, compositions, sequences."""
        try:
            self._compile(event)
        except UnsupportedEventError:
            return False
        return True

    def mu(self, event: Mechanism, counts: ArrayLike = 1) -> np.ndarray:
        """CLT μ per row of ``counts[i]`` repetitions of ``event`` (0 repetitions: 0)."""
        program = self._compile(event)
        sizes = set(program.rows) - {1}
        if len(sizes) > 1:
            raise ValueError(
                f"events: per-record rate arrays of different lengths {sorted(sizes)} "
                "cannot be composed"
            )
        n = sizes.pop() if sizes else 1
        k = check_counts(counts, n)
        return np.broadcast_to(program.mu(k), (n,)).astype(np.float64)

    def epsilon(self, event: Mechanism, delta: float) -> tuple[np.ndarray, np.ndarray]:
        """ε per row at ``delta`` (μ-GDP conversion of the CLT μ) and μ."""
        return self.composed_epsilon(event, 1, delta)

    def composed_epsilon(
        self, event: Mechanism, counts: ArrayLike, delta: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """ε of ``counts[i]`` repetitions of row i of ``event`` at ``delta``, and μ."""
        mu = self.mu(event, counts)
        eps = np.full(mu.shape, np.inf)
        finite = np.isfinite(mu)
        if finite.any():
            eps[finite] = np.asarray(gdp_epsilon(mu[finite], float(delta)), dtype=np.float64)
        return eps, mu


def _factory(**options: object) -> GdpCltAccountant:
    if options:
        raise ValueError(
            f"accountant: gdp-clt takes no options (it has no orders), got {sorted(options)}"
        )
    return GdpCltAccountant()


register_accountant("gdp-clt", _factory)
