"""Waiting without holding anything: ``sleep``, ``sleep_until``, ``wait_for_signal``
and ``take_token``.

A wait that is not over ends the instance; the host resumes the run on a fresh instance
when it is due, and the agent, replaying its way back to the same wait with the same
key, finds it over and goes on. Each wait is named by a key of the run: derive it from
what the agent is doing (``"backoff-order-17"``), never from the time or a counter of
instances, or a resumed agent waits again.
"""

from __future__ import annotations

import datetime as _dt
import math
from typing import Any, TypeAlias

from . import _errors, _json
from ._host import Err, raise_wait_error
from ._host import waits as wit_waits

#: A point in time: an aware ``datetime``, or seconds since the Unix epoch.
When: TypeAlias = _dt.datetime | float

_U64_MAX = (1 << 64) - 1


def _millis(seconds: float, what: str) -> int:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, not {type(seconds).__name__}")
    if math.isnan(seconds) or seconds < 0:
        raise ValueError(f"{what} must be zero or more seconds, not {seconds!r}")
    if math.isinf(seconds):
        # Beyond what the host keeps: it refuses the wait with its own reason.
        return _U64_MAX
    return min(round(seconds * 1000), _U64_MAX)


def sleep(key: str, seconds: float) -> None:
    """Sleeps ``seconds``, durably: the host records the wake time under ``key`` the
    first time the sleep is reached, ends the instance, and resumes the run when the
    time comes. Reached again after that time (the resumed run replaying its way here),
    it returns at once.

    Raises :class:`WaitError` (an invalid key, a time beyond what the host keeps, a
    key used by another kind of wait, a claim still held).
    """
    sleep_ms(key, _millis(seconds, "a sleep"))


def sleep_ms(key: str, ms: int) -> None:
    """:func:`sleep` for ``ms`` milliseconds, as the host counts them."""
    try:
        wit_waits.sleep(key, wit_waits.Wake_After(ms))
    except Err as err:
        raise_wait_error(err)


def take_token(step_key: str, rate_class: str) -> None:
    """Takes a token of the rate class ``rate_class`` for the step ``step_key`` about to
    run, or waits for one holding no instance. The operator limits a class's steps
    across every worker and run (``idem rate set llm --limit 60 --per 1m``); a class
    with no limit hands its token out at once. The token is reserved when this is first
    reached and recorded with the run, so the run resumed after a crash or a wait finds
    it again and takes no other. ``run_once(..., rate=CLASS)`` calls it before the
    step's claim.

    Raises :class:`WaitError` (an invalid key or class name, a claim still held).
    """
    try:
        wit_waits.take_token(step_key, rate_class)
    except Err as err:
        raise_wait_error(err)


def sleep_until(key: str, when: When) -> None:
    """Sleeps until ``when`` on the store's clock, durably, as :func:`sleep` does. A
    time already passed returns at once; a naive ``datetime`` is refused (its time zone
    would be a guess)."""
    if isinstance(when, _dt.datetime):
        if when.tzinfo is None:
            raise ValueError("sleep_until needs an aware datetime (with tzinfo)")
        ms = round(when.timestamp() * 1000)
    elif isinstance(when, (int, float)) and not isinstance(when, bool):
        if math.isnan(when) or math.isinf(when):
            raise ValueError(f"sleep_until needs a finite time, not {when!r}")
        ms = round(when * 1000)
    else:
        raise TypeError(f"sleep_until needs a datetime or epoch seconds, not {type(when).__name__}")
    ms = max(-(1 << 63), min(ms, (1 << 63) - 1))
    try:
        wit_waits.sleep(key, wit_waits.Wake_At(ms))
    except Err as err:
        raise_wait_error(err)


def wait_for_signal(key: str, name: str, timeout: float | None = None) -> Any:
    """Receives a signal called ``name`` sent to this run (``idem signal RUN NAME
    --payload JSON``) and returns its payload decoded from JSON; waits for one, holding
    no instance, for at most ``timeout`` seconds (``None``: for ever). A signal sent
    before the wait is kept until a wait asks for it.

    The signal is taken in the transaction that records it under ``key``: reached again
    (the run resumed after a crash), the wait answers the same payload, and no other
    wait of the run receives that signal. Raises :class:`TimedOut` when the timeout
    passed first (recorded too: a replay times out again at once).
    """
    timeout_ms = None if timeout is None else _millis(timeout, "a signal's timeout")
    try:
        received = wit_waits.wait_for_signal(key, name, timeout_ms)
    except Err as err:
        raise_wait_error(err)
    if isinstance(received, wit_waits.Received_TimedOut):
        raise _errors.TimedOut(name)
    return _json.loads(bytes(received.value), "signal payload")
