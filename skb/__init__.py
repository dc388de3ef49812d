"""The System Knowledge Base: SWI-Prolog holding system- and application-level facts."""

from .async_engine import AsyncSKB
from .engine import SKB, EngineConfig, library_dir
from .errors import CODES, SKBError

__all__ = ["SKB", "AsyncSKB", "SKBError", "CODES", "EngineConfig", "library_dir"]
