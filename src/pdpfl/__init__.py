"""pdpfl: cross-silo federated learning with personalized differential privacy.

The short path (see :mod:`pdpfl.api`): build a federation from your own data with
:func:`federation_from_dataframe`, :func:`federation_from_arrays` or
:func:`federation_from_silos`, then :func:`train` any torch module on it with per-record budgets
matched by record id. These names are imported on first use, so ``import pdpfl`` stays light.
"""

from typing import Any

from pdpfl._version import __version__

#: Public names re-exported from :mod:`pdpfl.api` (imported lazily).
_API = (
    "align_budgets",
    "federation_from_arrays",
    "federation_from_dataframe",
    "federation_from_silos",
    "lifetime_budgets",
    "load_model",
    "privacy_table",
    "register_module",
    "train",
    "verify_run",
)

__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    if name in _API:
        from pdpfl import api

        return getattr(api, name)
    raise AttributeError(f"module 'pdpfl' has no attribute {name!r}")
