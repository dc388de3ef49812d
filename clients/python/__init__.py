"""`cod.client`: the Python client of the COD Resource Manager (protocol: docs/protocol.md)."""

from .client import Client
from .errors import (
    AdmissionRefused,
    AlreadyExists,
    CallTimeout,
    CodError,
    ConnectionLost,
    InvalidRequest,
    NotConnected,
    NotFound,
    OutcomeUnknown,
    PermissionDenied,
    ProtocolMismatch,
    QueryCancelled,
    QueryTimeout,
    RMError,
    KnowledgeBaseError,
    QuotaExceeded,
    ReplyLost,
    TimedOut,
    TooBusy,
    ShuttingDown,
    UnsafeGoal,
)
from .paper import add_procedure, rsmgr_client_connect, rsmgr_register_fn, skb_add_fact, skb_add_fn, skb_execute_query

connect = Client.connect

__all__ = [
    "AdmissionRefused", "AlreadyExists", "CallTimeout", "CodError", "Client", "ConnectionLost", "InvalidRequest",
    "NotConnected", "NotFound", "OutcomeUnknown", "PermissionDenied", "ProtocolMismatch", "QueryCancelled", "QueryTimeout", "RMError",
    "KnowledgeBaseError", "QuotaExceeded", "ReplyLost", "ShuttingDown", "TimedOut", "TooBusy", "UnsafeGoal", "add_procedure", "connect", "rsmgr_client_connect",
    "rsmgr_register_fn", "skb_add_fact", "skb_add_fn", "skb_execute_query",
]
