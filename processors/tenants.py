"""Tenants: the part of a user id before its first delimiter (`acme:1` → `acme`).

A grant's prefix pattern ends at one of these delimiters (`acme:*`, never
`acme*`, which would also cover `acme2`), and budgets are kept per tenant as
well as per user, so users of one tenant never spend another's share.
"""

from __future__ import annotations

DELIMITERS = (":", "-", "_", "/", ".", "@")


def tenant_of(user_id: str, delimiter: str = ":") -> str:
    """The user's tenant; an id without the delimiter is a tenant of its own."""
    head, found, _ = user_id.partition(delimiter)
    return head if found and head else user_id
