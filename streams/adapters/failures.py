"""Which failures are a dependency's, not a record's (the pipeline's error policy).

A transient failure — the view, the broker or the network not answering — is
retried until it passes and never dead-lettered; anything else that a record
makes fail on every try is the record's (a contract error, a bug it hits).
The reasoner's own failures are neither: a cycle reports them in its audit
event and the breaker counts them.
"""

from __future__ import annotations

import asyncio

from processors.ports import ViewUnavailable
from schemas import ContractError


def transient(error: BaseException) -> bool:
    if isinstance(error, ContractError):
        return False
    if isinstance(error, (OSError, TimeoutError, asyncio.TimeoutError, ViewUnavailable)):
        return True
    if getattr(error, "retriable", False):  # aiokafka's errors say it themselves
        return True
    # qdrant-client: no answer at all, or an overloaded or failing server.
    name, status = type(error).__name__, getattr(error, "status_code", None)
    return name == "ResponseHandlingException" or (
        name == "UnexpectedResponse" and (status is None or status >= 500 or status == 429))
