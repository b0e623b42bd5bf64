"""pdpfl: cross-silo federated learning with personalized differential privacy."""

__version__ = "0.1.0"
