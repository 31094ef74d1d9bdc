"""Step retries: :func:`run_once_retry` runs a side effect under a key until it succeeds,
waiting between attempts with a durable sleep (the run holds no instance while it backs
off), and commits the last error as the step's result once the attempts are spent or the
error is permanent, so that a replay never retries it again.

It is the Rust SDK's ``run_once_retry`` (``guest-sdk/src/retry.rs``) to the byte: the
same backoff sleeps under the same keys, and the same committed encoding
(``{"Ok": value}`` or ``{"Err": "message"}``), so a Rust and a Python agent sharing a key
agree on its result.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import _json
from ._errors import CodecError, EffectFailed
from ._host import Err, raise_step_error, types
from ._host import once as wit_once
from ._keys import Key, as_key
from ._once import Outcome, Step, obtained, step_of
from ._waits import sleep_ms

_U64_MAX = (1 << 64) - 1


def _ms(seconds: float, what: str) -> int:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds >= 0:
        raise ValueError(f"RetryPolicy.{what} must be zero or more seconds, not {seconds!r}")
    return min(round(seconds * 1000), _U64_MAX)


@dataclass(frozen=True)
class RetryPolicy:
    """How :func:`run_once_retry` retries a failing side effect.

    The wait before attempt ``n + 1`` is ``initial_delay * multiplier**(n - 1)``, at most
    ``max_delay``; with ``jitter``, a random point between half of it and all of it (so
    that many runs failing together do not retry together). Delays are in seconds and
    are kept to the millisecond. The defaults: 5 attempts, 1 s doubling up to 5 minutes,
    with jitter.

    >>> policy = RetryPolicy(jitter=False)
    >>> [policy.delay(n) for n in (1, 2, 3, 30)]
    [1.0, 2.0, 4.0, 300.0]
    >>> 2.0 <= RetryPolicy().delay(3, random=12345) <= 4.0
    True
    """

    #: Attempts in all, the first included (at least 1).
    max_attempts: int = 5
    #: The wait after the first failed attempt, in seconds.
    initial_delay: float = 1.0
    #: How much each wait grows over the one before.
    multiplier: int = 2
    #: The longest wait, in seconds.
    max_delay: float = 300.0
    #: Randomise each wait between half of it and all of it.
    jitter: bool = True

    def delay(self, attempt: int, random: int = 0) -> float:
        """The wait in seconds after failed attempt ``attempt`` (1-based), ``random``
        choosing the jitter."""
        return self.delay_ms(attempt, random) / 1000

    def delay_ms(self, attempt: int, random: int = 0) -> int:
        """:meth:`delay` in milliseconds, as the host is asked to sleep."""
        longest = _ms(self.max_delay, "max_delay")
        delay = _ms(self.initial_delay, "initial_delay")
        for _ in range(1, attempt):
            delay = min(delay * max(self.multiplier, 1), _U64_MAX)
            if delay >= longest:
                break
        delay = min(delay, longest)
        if not self.jitter:
            return delay
        half = delay // 2
        return half + random % (delay - half + 1)


class Transient(Exception):
    """Raised by a :func:`run_once_retry` side effect: this attempt failed and may be
    retried (a timeout, a 503). ``error`` says why; its text is what gets committed if
    the attempts run out."""

    def __init__(self, error: object) -> None:
        super().__init__(error)
        self.error = error

    def __str__(self) -> str:
        return str(self.error)


class Permanent(Exception):
    """Raised by a :func:`run_once_retry` side effect: this attempt failed and retrying
    will not help (a refused card, a 400). ``error`` is committed as the step's result
    at once."""

    def __init__(self, error: object) -> None:
        super().__init__(error)
        self.error = error

    def __str__(self) -> str:
        return str(self.error)


def run_once_retry(
    key: Key | str,
    fn: Callable[[Step], Any],
    *,
    policy: RetryPolicy | None = None,
    fingerprint: Any = None,
    type: Any = None,
) -> tuple[Any, Outcome]:
    """Runs ``fn(step)`` once per attempt under ``key`` until it succeeds, as
    :func:`run_once` runs it once, retrying as ``policy`` says (default
    :class:`RetryPolicy`); returns ``(value, outcome)``:

    - ``fn`` returns ``value``: committed, as ``run_once`` does;
    - ``fn`` raises :class:`Transient` with attempts left: the claim is released and the
      run sleeps durably (:func:`sleep`, under a key derived from ``key`` and the
      attempt) for the policy's delay, holding no instance; it then claims the key again,
      with the next ``step.attempt`` (attempts count in the store, across instances);
    - ``fn`` raises :class:`Permanent`, or :class:`Transient` on the last attempt: its
      error is committed as the step's result and the call raises
      :class:`~idem.EffectFailed`; every later call (a replay, another run sharing the
      key) raises it the same way without running ``fn``;
    - ``fn`` raises anything else: the claim is released and the exception propagates,
      as with ``run_once`` (a bug is not a failure to commit).

    A key committed by ``run_once_retry`` must only be run with ``run_once_retry``: its
    stored result records success or failure. ``fingerprint`` binds the key to its input
    and ``type`` decodes a committed value, as with ``run_once``.

    >>> import idem
    >>> def charge(step):
    ...     r = idem.http.post("https://payments.example.com/charges", json={"order": 17})
    ...     if r.status >= 500:
    ...         raise idem.Transient(f"{r.status} from the payment API")
    ...     if not r.ok:
    ...         raise idem.Permanent(f"refused: {r.text}")
    ...     return r.json()
    """
    policy = policy or RetryPolicy()
    k = as_key(key)
    if fingerprint is not None:
        k = k.with_input(fingerprint)
    while True:
        try:
            got = wit_once.run_once(k.text, k.fingerprint)
        except Err as err:
            raise_step_error(err)
        if isinstance(got, wit_once.Outcome_Committed):
            return _decode(k, got.value, type)
        claim = got.value
        step = step_of(claim)
        settled: dict[str, Any]
        try:
            settled = {"Ok": fn(step)}
        except Transient as failure:
            if step.attempt < max(policy.max_attempts, 1):
                wit_once.Claim.release(claim)
                delay = policy.delay_ms(step.attempt, _random())
                # Kept in the run's log (`idem logs`): why the step is waiting.
                print(
                    f"attempt {step.attempt} of {k} failed: {failure}; retrying in {delay} ms",
                    file=sys.stderr,
                )
                sleep_ms(backoff_key(k, step.attempt), delay)
                continue
            settled = {"Err": f"{failure} (gave up after attempt {step.attempt})"}
        except Permanent as failure:
            settled = {"Err": f"{failure} (permanent, at attempt {step.attempt})"}
        except BaseException:
            wit_once.Claim.release(claim)
            raise
        try:
            data = _json.dumps(settled, f"result of {k}")
        except BaseException:
            wit_once.Claim.release(claim)
            raise
        try:
            wit_once.Claim.commit(claim, data, None)
        except Err as err:
            # Taken over while `fn` ran: whatever the taker committed is the answer.
            if isinstance(err.value, types.StepError_ClaimLost):
                continue
            raise_step_error(err)
        if "Err" in settled:
            raise EffectFailed(settled["Err"])
        return settled["Ok"], Outcome.RECLAIMED if step.in_doubt else Outcome.EXECUTED


def _decode(key: Key, committed: wit_once.Committed, type: Any) -> tuple[Any, Outcome]:
    what = f"committed result of {key}"
    value = _json.loads(committed.value, what)
    if isinstance(value, dict) and len(value) == 1:
        if "Ok" in value:
            return _json.build(type, value["Ok"], what), obtained(committed)
        if isinstance(value.get("Err"), str):
            raise EffectFailed(value["Err"])
    raise CodecError(f"{what}: not a run_once_retry result (was the key run with run_once?)")


def backoff_key(key: Key, attempt: int) -> str:
    """The key of the sleep after failed attempt ``attempt`` of ``key``: derived from
    both, so a replay finds the same sleep, and short whatever the key's length."""
    # FNV-1a over the key's UTF-8 bytes, as the Rust SDK hashes it.
    hash = 0xCBF2_9CE4_8422_2325
    for byte in key.text.encode("utf-8"):
        hash = ((hash ^ byte) * 0x0000_0100_0000_01B3) & _U64_MAX
    return f"retry-{hash:016x}-{attempt}"


def _random() -> int:
    # From the host's random source at call time: `random`'s generator would be seeded
    # once, when the component was built, and draw the same jitter in every instance.
    return int.from_bytes(os.urandom(8), "little")
