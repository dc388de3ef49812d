"""The root of COD's errors.

Every error class of the package derives from :class:`CodError`, so a caller
can catch everything COD raises with one ``except`` and still tell the kinds
apart (``SKBError``, ``RpcError``, ``EnforceError``, ``FactsError``, the
client's ``RMError``, ``DeployError``, ``ElasticError``, ``PerfError``, the
shell's ``ShellError`` and ``ConnectionProblem`` ...).  Where callers catch a
built-in base it is kept as a second base (``DeployError(CodError,
ValueError)``, ``PerfError(CodError, OSError)``).  It lives here, in the
module every other part imports, because clients must not need the daemon's
modules to catch it; tests/project/test_error_root.py walks every module of ``cod``
and checks each public exception class derives from it.
"""

from __future__ import annotations


class CodError(Exception):
    """Base class of every error raised by COD."""
