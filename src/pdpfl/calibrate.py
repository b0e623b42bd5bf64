"""Re-export shim of :mod:`pdpfl.calibration` (the calibration API now lives there).

Kept until the fl/ packages switch to ``pdpfl.calibration``; to be deleted.
"""

from pdpfl.calibration import *  # noqa: F403
from pdpfl.calibration import __all__  # noqa: F401
