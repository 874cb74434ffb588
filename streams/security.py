"""Broker security from settings, in one place for every Kafka client Reflect makes.

Faust (the worker's consumer, producer and admin client) takes credentials
objects; the aiokafka clients Reflect creates itself (topic admin, publisher,
rebuild reader) take keyword arguments. Both are built here from the same
settings so they can never disagree: a worker that joins the group over
SASL_SSL while its topic admin tries PLAINTEXT would fail late and obscurely.
"""

from __future__ import annotations

import ssl
from typing import Any

from streams.settings import Settings


def ssl_context(settings: Settings) -> ssl.SSLContext | None:
    """The TLS context of SSL / SASL_SSL (host names checked), else None."""
    if not settings.broker_security_protocol.endswith("SSL"):
        return None
    from aiokafka.helpers import create_ssl_context

    return create_ssl_context(cafile=settings.broker_ssl_cafile, certfile=settings.broker_ssl_certfile,
                              keyfile=settings.broker_ssl_keyfile)


def client_options(settings: Settings) -> dict[str, Any]:
    """Keyword arguments of any aiokafka client (producer, consumer, admin):
    the bootstrap servers and the security the settings ask for."""
    protocol = settings.broker_security_protocol
    options: dict[str, Any] = {"bootstrap_servers": settings.bootstrap, "security_protocol": protocol}
    context = ssl_context(settings)
    if context is not None:
        options["ssl_context"] = context
    if protocol.startswith("SASL_"):
        options.update(sasl_mechanism=settings.broker_sasl_mechanism,
                       sasl_plain_username=settings.broker_sasl_username,
                       # str(): aiokafka hands it to the SCRAM/PLAIN code as a plain string
                       sasl_plain_password=str(settings.broker_sasl_password))
    return options


def faust_credentials(settings: Settings):
    """`broker_credentials` of faust.App: SASLCredentials (with the TLS context
    for SASL_SSL), SSLCredentials, or None for PLAINTEXT."""
    import faust

    protocol, context = settings.broker_security_protocol, ssl_context(settings)
    if protocol.startswith("SASL_"):
        return faust.SASLCredentials(username=settings.broker_sasl_username,
                                     password=str(settings.broker_sasl_password),
                                     mechanism=settings.broker_sasl_mechanism, ssl_context=context)
    if protocol == "SSL":
        # The context is passed in: SSLCredentials() builds none by itself
        # (it calls create_default_context(purpose=None), a TypeError).
        return faust.SSLCredentials(context)
    return None
