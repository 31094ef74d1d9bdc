"""``run_once_all``: several steps claimed together, their side effects in flight at
once (the ``run-once-many`` import)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from . import _errors, _json
from ._host import Err, raise_step_error, types
from ._host import once as wit_once
from ._keys import Key, as_key
from ._once import Outcome, Step, obtained, step_of


def _decode(key: Key, committed: wit_once.Committed, type: Any) -> Any:
    value = _json.loads(committed.value, f"committed result of {key}")
    return _json.build(type, value, f"committed result of {key}")


def run_once_all(
    keys: Sequence[Key | str],
    fn: Callable[[list[Step]], Sequence[Any]],
    *,
    type: Any = None,
) -> list[tuple[Any, Outcome]]:
    """Runs the side effects of several steps together, each at most once per
    committed key; returns ``(value, outcome)`` per key, in the order of ``keys``.

    The keys are claimed in one host call (all or none: a refused key raises and holds
    nothing; more than the host's limit of claims held at once, 64 by default, raises
    :class:`~idem.TooLarge`). Committed keys hand back their stored results. ``fn`` is
    called once with the :class:`Step` of each key still to run (in the order of
    ``keys``) and returns one value per step in that order: that is where the effects
    run concurrently, say with :func:`idem.http.send_all`, each request tied to its
    step (``under=step``) so that it carries its own key and token. A value that is an
    exception marks its step failed: its claim is released, the others are committed,
    and the first such exception is raised. When ``fn`` itself raises, every claim is
    released. In doubt after a crash, a step runs again (``idem.RETRY``).
    """
    ks = [as_key(k) for k in keys]
    requests = [
        wit_once.StepRequest(k.text, k.fingerprint, wit_once.Durability.WITH_COMMIT) for k in ks
    ]
    try:
        outcomes = wit_once.run_once_many(requests)
    except Err as err:
        raise_step_error(err)
    results: list[tuple[Any, Outcome] | None] = [None] * len(ks)
    claimed: list[tuple[int, Step, wit_once.Claim]] = []
    try:
        for i, outcome in enumerate(outcomes):
            got = outcome.value
            if isinstance(got, wit_once.Committed):
                results[i] = (_decode(ks[i], got, type), obtained(got))
            else:
                claimed.append((i, step_of(got), got))
    except BaseException:
        for _, _, claim in claimed:
            wit_once.Claim.release(claim)
        raise
    if claimed:
        _settle(ks, claimed, fn, results, type)
    done = [r for r in results if r is not None]
    if len(done) != len(ks):
        raise _errors.IdemError("run_once_all: a step was left without a result")
    return done


def _settle(
    ks: list[Key],
    claimed: list[tuple[int, Step, wit_once.Claim]],
    fn: Callable[[list[Step]], Sequence[Any]],
    results: list[tuple[Any, Outcome] | None],
    type: Any,
) -> None:
    steps = [step for _, step, _ in claimed]
    try:
        values = list(fn(steps))
        if len(values) != len(steps):
            raise _errors.IdemError(
                f"run_once_all: the side effects returned {len(values)} results for "
                f"{len(steps)} steps"
            )
    except BaseException:
        for _, _, claim in claimed:
            wit_once.Claim.release(claim)
        raise
    failed: BaseException | None = None
    for (i, step, claim), value in zip(claimed, values, strict=True):
        try:
            results[i] = _commit(ks[i], step, claim, value, type)
        except Exception as exc:
            failed = failed or exc
    if failed is not None:
        raise failed


def _commit(
    key: Key, step: Step, claim: wit_once.Claim, value: Any, type: Any
) -> tuple[Any, Outcome]:
    if isinstance(value, BaseException):
        wit_once.Claim.release(claim)
        raise value
    try:
        data = _json.dumps(value, f"result of {key}")
    except BaseException:
        wit_once.Claim.release(claim)
        raise
    try:
        wit_once.Claim.commit(claim, data, None)
    except Err as err:
        if isinstance(err.value, types.StepError_ClaimLost):
            # Taken over while the effect ran: the taker's commit is the key's result.
            try:
                again = wit_once.run_once_with(
                    key.text, key.fingerprint, wit_once.Durability.WITH_COMMIT
                )
            except Err as err2:
                raise_step_error(err2)
            if isinstance(again.value, wit_once.Committed):
                return _decode(key, again.value, type), Outcome.AWAITED
            wit_once.Claim.release(again.value)
        raise_step_error(err)
    return value, Outcome.RECLAIMED if step.in_doubt else Outcome.EXECUTED
