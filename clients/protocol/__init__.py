"""COD's wire protocol, shared by the daemon, the SKB engine driver and every client.

Nothing here imports the daemon or needs its dependencies: a client
installs ``cod.protocol`` and ``cod.client`` alone.

* :mod:`.errors`: ``CodError``, the root of every error class of the package;
* :mod:`.framing`: 4-byte length-prefixed frames;
* :mod:`.jsonrpc`: JSON-RPC 2.0 messages, the protocol version, error codes,
  method and event names;
* :mod:`.names`: what an application or task name may be;
* :mod:`.prolog_text`: the one writer of Prolog text (atoms, strings, numbers,
  terms; data for the SKB and the shell's display);
* :mod:`.terms`: the one reader of Prolog text (canonical terms, unification);
* :mod:`.paths`: where the daemon's socket is by default.
"""

from .errors import CodError

__all__ = ["CodError"]
