"""What the commands show and write about finished runs, as library functions.

The command-line modules (:mod:`pdpfl.cli`) only parse arguments, call these and map errors to
exit codes:

* :mod:`~pdpfl.reports.tables` -- the terminal tables of ``pdpfl run``, ``compare`` and
  ``privacy`` (rich, ≤ 80 columns);
* :mod:`~pdpfl.reports.compare` -- ``pdpfl compare``'s rows, mechanism columns, accuracy
  curves and plot;
* :mod:`~pdpfl.reports.privacy` -- ``pdpfl privacy``'s per-unit rows, CSV, descriptions and
  the budget store's tables.
"""
