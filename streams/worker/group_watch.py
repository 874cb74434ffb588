"""A consumer group the broker refuses to let the worker join: say why, and exit.

aiokafka gives up on a few JoinGroup answers (a session timeout outside the
broker's range, a refused group id, no authorization for the group) and parks
the error for the next `getmany`. Faust calls `getmany` only once partitions
are assigned, which they never will be, so the worker stayed up and unhealthy
with one ERROR line among its start-up logs. This watch reads the parked
error, logs what to change, and crashes the app: the worker exits non-zero,
and a supervisor sees a failure instead of a hang.

It is a mode Service added to the app, because the app's timers start only
after table recovery, and recovery waits for the assignment that never comes.
"""

from __future__ import annotations

import logging

from aiokafka import errors
from mode import Service

from streams.settings import Settings

log = logging.getLogger(__name__)

CHECK_INTERVAL = 1.0


class GroupJoinRefused(RuntimeError):
    """The broker will not let this worker into its consumer group."""


def refusal(error: BaseException | None, settings: Settings) -> str | None:
    """What to tell the operator about an error aiokafka gave up on; None when
    there is none, or it is not a refusal of the group."""
    group = settings.app_id
    if isinstance(error, errors.InvalidSessionTimeoutError):
        return (f"the broker refuses a session timeout of {settings.session_timeout:g} s for group {group!r}: "
                "set REFLECT_SESSION_TIMEOUT (--session-timeout) within the broker's "
                "group.min.session.timeout.ms and group.max.session.timeout.ms (Apache Kafka: 6 to 1,800 s)")
    if isinstance(error, errors.GroupAuthorizationFailedError):
        return f"not authorized for consumer group {group!r}: grant the worker's principal READ on the group"
    if isinstance(error, errors.InvalidGroupIdError):
        return f"the broker refuses the group id {group!r}: set REFLECT_APP_ID (--app-id) to another name"
    if isinstance(error, errors.InconsistentGroupProtocolError):
        return (f"consumer group {group!r} is in use by clients with another protocol: "
                "another application shares REFLECT_APP_ID; give each its own")
    return None


def parked_error(app) -> BaseException | None:
    """The error aiokafka's group coordinator holds for the next fetch, if any.

    Private attributes of Faust and aiokafka (Faust itself reads the
    coordinator this way); tests/integration/test_group_watch.py fails if they move. A
    plain read from the main thread, since the consumer runs in its own thread
    and loop: consuming the error there is not ours to do.
    """
    consumer = getattr(getattr(app._consumer, "_thread", None), "_consumer", None)
    return getattr(getattr(consumer, "_coordinator", None), "_pending_exception", None)


class GroupWatch(Service):
    def __init__(self, app, settings: Settings, **kwargs) -> None:
        self.app, self.settings = app, settings
        super().__init__(**kwargs)

    @Service.timer(CHECK_INTERVAL)
    async def _check(self) -> None:
        why = refusal(parked_error(self.app), self.settings)
        if why is not None:
            log.critical("cannot join the consumer group: %s; the worker exits", why,
                         extra={"group": self.settings.app_id})
            await self.app.crash(GroupJoinRefused(why))
