"""The base of every configuration section, the configuration error and the public limits every
section shares (:mod:`pdpfl.config`).
"""

from __future__ import annotations

from pydantic import (
    BaseModel,
    ConfigDict,
)

#: Joins several cross-section problems in one ValueError; split again by :func:`_format_errors`.
_PROBLEM_SEPARATOR = "\n"


#: Largest public expected batch size B (a larger one divides every noisy sum into nothing:
#: a run that trains nothing and reports success).
MAX_BATCH_SIZE = 1e9
#: Largest hyper-parameter the float32 model can take (a larger one does not convert).
FLOAT32_MAX = 3.4028234663852886e38


class ConfigError(ValueError):
    """Invalid configuration; ``problems`` holds one ``field: message`` string per problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)
