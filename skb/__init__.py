"""The System Knowledge Base: SWI-Prolog holding system- and application-level facts."""

from .async_engine import AsyncSKB
from .codec import NO_LIMITS, PERSISTENT, Limits, Staged
from .engine import SKB
from .errors import CODES, OutcomeUnknown, SKBError
from .session import EngineConfig, library_dir

__all__ = ["SKB", "AsyncSKB", "SKBError", "OutcomeUnknown", "CODES", "EngineConfig", "library_dir", "Limits", "NO_LIMITS",
           "PERSISTENT", "Staged"]
