"""``run_once`` and ``once``: a side effect at most once per committed key."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, TypeAlias

from . import _errors, _json
from ._host import Err, raise_step_error, types
from ._host import once as wit_once
from ._host import progress as wit_progress
from ._keys import Key, as_key


class Outcome(enum.Enum):
    """How a step reached its result."""

    #: This call claimed the key, ran the side effect and committed its result.
    EXECUTED = "executed"
    #: As ``EXECUTED``, but an earlier holder may have begun the effect and died.
    RECLAIMED = "reclaimed"
    #: The claim was in doubt and the probe found the effect applied.
    PROBED = "probed"
    #: The key was committed before: the effect did not run again.
    SKIPPED = "skipped"
    #: Another live holder ran the key; this call waited for its commit.
    AWAITED = "awaited"

    @property
    def ran(self) -> bool:
        """Whether the side effect ran in this call."""
        return self in (Outcome.EXECUTED, Outcome.RECLAIMED)


@dataclass(frozen=True)
class Step:
    """What the side effect may know about its claim; pass ``key`` or ``token`` on."""

    key: str
    attempt: int
    token: int
    in_doubt: bool


#: The in-doubt policies: run again (downstream dedupes on the key), or stop the run
#: in doubt for ``idem resolve``. A callable is a probe: ``probe(step)`` returns
#: ``(True, value)`` when the effect was applied (``value`` is committed without
#: running the effect) and ``(False, None)`` when it was not.
RETRY = "retry"
FAIL = "fail"
Probe: TypeAlias = Callable[[Step], tuple[bool, Any]]
Policy: TypeAlias = str | Probe

#: A checkpoint to save with the commit: ``(step, state)`` or a function of the value.
Save: TypeAlias = tuple[int, Any] | Callable[[Any], tuple[int, Any]]


def _checkpoint(save: Save | None, value: Any) -> wit_progress.Checkpoint | None:
    if save is None:
        return None
    step, state = save(value) if callable(save) else save
    return wit_progress.Checkpoint(int(step), _json.dumps(state, "checkpoint state"))


def step_of(claim: wit_once.Claim) -> Step:
    """What the side effect may know about ``claim``."""
    return Step(claim.key(), claim.attempt(), claim.token(), claim.in_doubt())


def _claim(key: Key, policy: Policy, rate: str | None) -> wit_once.Claim | wit_once.Committed:
    # A step that retries in doubt needs its claim durable only with its commit (one
    # sync per step); one that stops or probes in doubt needs it durable before the
    # effect, or a crash of the machine could hide that the effect began.
    durability = (
        wit_once.Durability.WITH_COMMIT if policy == RETRY else wit_once.Durability.BEFORE_EFFECT
    )
    try:
        if rate is None:
            outcome = wit_once.run_once_with(key.text, key.fingerprint, durability)
        else:
            # The token and the claim in one host call (one store transaction).
            outcome = wit_once.run_once_rated(key.text, key.fingerprint, durability, rate)
    except Err as err:
        raise_step_error(err)
    return outcome.value


def obtained(committed: wit_once.Committed) -> Outcome:
    """How a committed result reached this call."""
    if committed.obtained == wit_once.Obtained.AWAITED:
        return Outcome.AWAITED
    return Outcome.SKIPPED


class Once:
    """One durable step, used as ``with idem.once(key) as step:``.

    Entering claims the key or finds it committed. When ``step.done``, ``step.value``
    is the committed result and the body must not run the effect again; otherwise the
    body runs it and calls ``step.commit(value)``. Leaving the block by an exception
    releases the claim (a later attempt retries under the same key) and lets the
    exception through; leaving it without a commit releases the claim and raises
    :class:`~idem.IdemError`. After the commit, the step is settled: ``commit`` again
    raises :class:`~idem.ClaimSettled`, never a trap. With ``rate``, entering takes a
    token of that rate class with the claim, and waits for one holding nothing while
    the class is over its limit.
    """

    def __init__(
        self,
        key: Key | str,
        *,
        in_doubt: Policy = RETRY,
        type: Any = None,
        rate: str | None = None,
    ) -> None:
        self.key = as_key(key)
        self._policy = in_doubt
        self._rate = rate
        self._type = type
        self._claim: wit_once.Claim | None = None
        self._save: Save | None = None
        self._settled = False
        self.done = False
        self.value: Any = None
        self.outcome: Outcome | None = None
        self.step: Step | None = None

    # The claim's facts, for the body of the `with` block.
    @property
    def attempt(self) -> int:
        return self._require_step().attempt

    @property
    def token(self) -> int:
        return self._require_step().token

    @property
    def in_doubt(self) -> bool:
        return self._require_step().in_doubt

    def _require_step(self) -> Step:
        if self.step is None:
            raise _errors.ClaimSettled(f"{self.key}: no claim is held (the key was committed)")
        return self.step

    def __enter__(self) -> Once:
        self._begin()
        return self

    def _begin(self) -> None:
        got = _claim(self.key, self._policy, self._rate)
        if isinstance(got, wit_once.Committed):
            self._found(got)
            return
        claim = got
        self.step = step_of(claim)
        self._claim = claim
        if not self.step.in_doubt or self._policy == RETRY:
            return
        if self._policy == FAIL:
            self._settled = True
            self._claim = None
            wit_once.Claim.stop(
                claim, f"attempt {self.step.attempt - 1} of {self.key} may have run already"
            )
            # The host ends the instance inside `stop`.
            raise _errors.IdemError(f"the host did not stop the run in doubt at {self.key}")
        if callable(self._policy):
            try:
                applied, value = self._policy(self.step)
            except BaseException:
                self.release()
                raise
            if applied:
                self.commit(value, save=self._save)
                self.outcome = Outcome.PROBED
            return
        self.release()
        raise ValueError(f"in_doubt must be idem.RETRY, idem.FAIL or a probe, not {self._policy!r}")

    def _found(self, committed: wit_once.Committed) -> None:
        self.done = True
        self._settled = True
        value = _json.loads(committed.value, f"committed result of {self.key}")
        self.value = _json.build(self._type, value, f"committed result of {self.key}")
        self.outcome = obtained(committed)

    def commit(self, value: Any = None, *, save: Save | None = None) -> None:
        """Commits ``value`` (JSON) as the key's result, with the checkpoint ``save``
        written in the same transaction when given."""
        if self._settled or self._claim is None:
            raise _errors.ClaimSettled(f"{self.key}: the step was already settled")
        try:
            data = _json.dumps(value, f"result of {self.key}")
            checkpoint = _checkpoint(save, value)
        except BaseException:
            self.release()
            raise
        claim, self._claim = self._claim, None
        self._settled = True
        try:
            wit_once.Claim.commit(claim, data, checkpoint)
        except Err as err:
            if isinstance(err.value, types.StepError_ClaimLost):
                # The claim was taken over while the effect ran: the taker's commit is
                # the key's result, if it made one.
                got = _claim(self.key, self._policy, None)
                if isinstance(got, wit_once.Committed):
                    self._found(got)
                    self.outcome = Outcome.AWAITED
                    _save_checkpoint(save, self.value)
                    return
                wit_once.Claim.release(got)
            raise_step_error(err)
        self.done = True
        self.value = value
        in_doubt = self.step is not None and self.step.in_doubt
        self.outcome = Outcome.RECLAIMED if in_doubt else Outcome.EXECUTED

    def _result(self) -> tuple[Any, Outcome]:
        if self.outcome is None:
            raise _errors.IdemError(f"{self.key}: the step has no result yet")
        return self.value, self.outcome

    def release(self) -> None:
        """Gives the claim back without a result; a later attempt retries the key."""
        if self._claim is not None:
            claim, self._claim = self._claim, None
            self._settled = True
            wit_once.Claim.release(claim)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        if self._claim is None:
            return False
        self.release()
        if exc_type is None:
            raise _errors.IdemError(
                f"the `with idem.once({self.key.text!r})` block ended without "
                "step.commit(value): the claim was released"
            )
        return False


def once(
    key: Key | str, *, in_doubt: Policy = RETRY, type: Any = None, rate: str | None = None
) -> Once:
    """A durable step for a ``with`` block; see :class:`Once`. With ``rate``, the step
    first takes a token of that rate class (:func:`~idem.take_token`)."""
    return Once(key, in_doubt=in_doubt, type=type, rate=rate)


def run_once(
    key: Key | str,
    fn: Callable[[Step], Any],
    *,
    in_doubt: Policy = RETRY,
    fingerprint: Any = None,
    save: Save | None = None,
    type: Any = None,
    rate: str | None = None,
) -> tuple[Any, Outcome]:
    """Runs ``fn(step)`` at most once per committed ``key``; returns ``(value, outcome)``.

    A committed key hands back its stored result without calling ``fn``. When ``fn``
    raises, the claim is released and the exception propagates: a later call retries
    under the same key with a higher attempt. ``fingerprint`` binds the key to its input
    (``Key.with_input``); ``save`` writes a checkpoint in the commit's transaction.
    ``rate`` names the step's rate class: before its claim the step takes a token of
    it (:func:`~idem.take_token`), waiting for one holding no instance while the class
    is over the limit the operator set.
    """
    k = as_key(key)
    if fingerprint is not None:
        k = k.with_input(fingerprint)
    step = Once(k, in_doubt=in_doubt, type=type, rate=rate)
    step._save = save
    step._begin()
    if step.done:
        if step.outcome != Outcome.PROBED:
            _save_checkpoint(save, step.value)
        return step._result()
    try:
        value = fn(step._require_step())
    except BaseException:
        step.release()
        raise
    step.commit(value, save=save)
    return step._result()


def _save_checkpoint(save: Save | None, value: Any) -> None:
    # A step found committed saves its checkpoint apart: the commit that carried it
    # was another call's.
    checkpoint = _checkpoint(save, value)
    if checkpoint is not None:
        _save_raw(checkpoint.step, checkpoint.state)


def _save_raw(step: int, state: bytes) -> None:
    try:
        wit_progress.save(step, state)
    except Err as err:
        raise_step_error(err)


@dataclass(frozen=True)
class Checkpoint:
    """A saved checkpoint: the step the agent reached and its state."""

    step: int
    state: Any


def load(type: Any = None) -> Checkpoint | None:
    """The run's last checkpoint, or ``None`` on a fresh run."""
    raw = wit_progress.load()
    if raw is None:
        return None
    state = _json.build(type, _json.loads(raw.state, "checkpoint state"), "checkpoint state")
    return Checkpoint(raw.step, state)


def save(step: int, state: Any = None) -> None:
    """Replaces the run's checkpoint with ``step`` and ``state`` (JSON)."""
    _save_raw(int(step), _json.dumps(state, "checkpoint state"))
