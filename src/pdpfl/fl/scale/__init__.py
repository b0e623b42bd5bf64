"""Scale: individualized DP-SGD by clipping (Boenisch et al., NeurIPS 2023, §4.2).

Record-level personalization by *sensitivity* instead of by sampling (rPDP-FL, IDP-FedAvg's
SAMPLE): every record is sampled at one rate q and every step adds one noise N(0, σ²C²), but
each budget group clips at its own C_p = σ·C/σ_p, so its records see the multiplier σ_p that
spends exactly their group's ε_p. The template the docs walk through for a new algorithm.

* :mod:`~pdpfl.fl.scale.mechanism` -- what the server publishes (σ, q, the groups' σ_p);
* :mod:`~pdpfl.fl.scale.silo` -- DP-SGD with per-record clip norms on the silo template;
* :mod:`~pdpfl.fl.scale.config` -- the ``scale`` config section, which builds them.
"""

from pdpfl.fl.scale.config import ScaleConfig
from pdpfl.fl.scale.mechanism import ScaleSetup, scale_setup
from pdpfl.fl.scale.silo import ScaleSilo

__all__ = ["ScaleConfig", "ScaleSetup", "ScaleSilo", "scale_setup"]
