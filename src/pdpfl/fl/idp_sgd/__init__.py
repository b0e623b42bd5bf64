"""Scale: individualized DP-SGD by clipping (Boenisch et al., NeurIPS 2023, §4.2).

Record-level personalization by *sensitivity* instead of by sampling (rPDP-FL, IDP-FedAvg's
SAMPLE): every record is sampled at one rate q and every step adds one noise N(0, σ²C²), but
each budget group clips at its own C_p = σ·C/σ_p, so its records see the multiplier σ_p that
spends exactly their group's ε_p. The template the docs walk through for a new algorithm.

* :mod:`~pdpfl.fl.idp_sgd.mechanism` -- what the server publishes (σ, q, the groups' σ_p);
* :mod:`~pdpfl.fl.idp_sgd.silo` -- DP-SGD with per-record clip norms on the silo template;
* :mod:`~pdpfl.fl.idp_sgd.server` -- λ-sampling of silos and the FedAvg step;
* :mod:`~pdpfl.fl.idp_sgd.config` -- the ``idp-sgd-scale`` config section, which builds them.
"""

from pdpfl.fl.idp_sgd.config import ScaleConfig
from pdpfl.fl.idp_sgd.mechanism import ScaleSetup, scale_setup
from pdpfl.fl.idp_sgd.server import ScaleServer
from pdpfl.fl.idp_sgd.silo import ScaleSilo

__all__ = ["ScaleConfig", "ScaleServer", "ScaleSetup", "ScaleSilo", "scale_setup"]
