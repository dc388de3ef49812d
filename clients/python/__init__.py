"""`cod.client`: the Python client of the COD Resource Manager (protocol: docs/protocol.md)."""

from .client import Client
from .errors import (
    AdmissionRefused,
    AlreadyExists,
    CODError,
    ConnectionLost,
    InvalidRequest,
    NotConnected,
    NotFound,
    PermissionDenied,
    ProtocolMismatch,
    QueryTimeout,
    RMError,
    SKBError,
    ShuttingDown,
    UnsafeGoal,
)
from .paper import add_procedure, rsmgr_client_connect, rsmgr_register_fn, skb_add_fact, skb_add_fn, skb_execute_query

connect = Client.connect

__all__ = [
    "AdmissionRefused", "AlreadyExists", "CODError", "Client", "ConnectionLost", "InvalidRequest",
    "NotConnected", "NotFound", "PermissionDenied", "ProtocolMismatch", "QueryTimeout", "RMError",
    "SKBError", "ShuttingDown", "UnsafeGoal", "add_procedure", "connect", "rsmgr_client_connect",
    "rsmgr_register_fn", "skb_add_fact", "skb_add_fn", "skb_execute_query",
]
