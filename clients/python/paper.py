"""The COD paper's names for the client calls (Table 2, Listing 1), as thin aliases of `Client`."""

from __future__ import annotations

from typing import Any

from .client import Client, Handler


def rsmgr_client_connect(path: str | None = None, **kwargs: Any) -> Client:
    """Connect to the RM (and, through it, to the SKB)."""
    return Client.connect(path, **kwargs)


def skb_add_fact(client: Client, fact: str) -> int:
    return client.add_fact(fact)


def skb_add_fn(client: Client, text: str) -> list[str]:
    """Add an application-specific function (stored procedure)."""
    return client.add_procedure(text)


add_procedure = skb_add_fn


def skb_execute_query(client: Client, goal: str) -> list[dict[str, Any]]:
    return client.execute_query(goal)


def rsmgr_register_fn(client: Client, event: str, filter: dict[str, Any] | None, handler: Handler) -> int:
    """(De-)register for notification: subscribe `handler` to `event`."""
    return client.subscribe(event, filter, handler)
