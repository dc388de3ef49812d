"""The System Knowledge Base: SWI-Prolog holding system- and application-level facts.

The names below are loaded on first use, so that what needs only the engine's settings
(:class:`EngineConfig`, which the RM's configuration takes its defaults from) or the pure codec
does not load the drivers and asyncio (~0.2 s)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .async_engine import AsyncSKB
    from .codec import NO_LIMITS, PERSISTENT, Limits, Staged
    from .engine import SKB
    from .errors import CODES, SKBError
    from .session import EngineConfig, library_dir

_HOME = {
    "SKB": "engine", "AsyncSKB": "async_engine", "SKBError": "errors", "CODES": "errors",
    "EngineConfig": "session", "library_dir": "session", "Limits": "codec", "NO_LIMITS": "codec",
    "PERSISTENT": "codec", "Staged": "codec",
}
__all__ = list(_HOME)


def __getattr__(name: str) -> object:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
