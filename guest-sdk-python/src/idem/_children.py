"""Child runs: ``spawn`` starts a run of a deployed agent exactly once (``spawn_many``
and ``spawn_all`` many in one write), and ``join``, ``join_all`` and ``join_any`` wait
for children's ends durably.

A join that is not over ends the instance; the run holds nothing until its children
have ended, when the host resumes it on a fresh instance, which replays its way back
here: its spawns find the children they started, and its join finds them ended.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from . import _errors, _json
from ._host import Err, raise_join_error, raise_spawn_error, spawn_error
from ._host import children as wit_children
from ._waits import _millis


class Child:
    """A child run this run spawned: its run id, stable across instances.

    It encodes as its run id in the contract's JSON, so a checkpoint can keep the
    children spawned so far (``idem.save(1, children)``); ``Child(run_id)`` makes one
    back from the id (a join of a run that is not this run's child is refused).

    >>> import idem
    >>> idem.Child("order-17~3f2a").run_id
    'order-17~3f2a'
    """

    __slots__ = ("run_id",)

    run_id: str

    def __init__(self, run_id: str) -> None:
        if not isinstance(run_id, str):
            raise TypeError(f"a child's run id is a str, got {type(run_id).__name__}")
        object.__setattr__(self, "run_id", run_id)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"a Child is immutable: cannot set {name!r}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Child) and other.run_id == self.run_id

    def __hash__(self) -> int:
        return hash(("idem.Child", self.run_id))

    def __repr__(self) -> str:
        return f"Child({self.run_id!r})"

    def __str__(self) -> str:
        return self.run_id

    def _json_value(self) -> str:
        # As the Rust SDK's `Child` (serde transparent): a checkpoint written by either
        # SDK reads back in the other.
        return self.run_id


class ChildOutcome:
    """How a joined child ended: one of ``ChildOutcome.Completed(value)`` (its output,
    decoded from JSON), ``ChildOutcome.Failed(error)`` (its error text: a child's
    failure is the parent's to handle, never a failure of the parent) and
    ``ChildOutcome.Cancelled()``. Match on them, or take :meth:`result`.

    >>> import idem
    >>> match idem.ChildOutcome.Failed("no such order"):
    ...     case idem.ChildOutcome.Completed(value):
    ...         print("got", value)
    ...     case idem.ChildOutcome.Failed(error):
    ...         print("failed:", error)
    ...     case idem.ChildOutcome.Cancelled():
    ...         print("cancelled")
    failed: no such order
    """

    Completed: ClassVar[type[Completed]]
    Failed: ClassVar[type[Failed]]
    Cancelled: ClassVar[type[Cancelled]]

    def result(self, child: Child) -> Any:
        """The output, or :class:`ChildFailed` naming ``child`` when it failed or was
        cancelled."""
        raise NotImplementedError


@dataclass(frozen=True)
class Completed(ChildOutcome):
    """The child returned ``value``."""

    value: Any

    def result(self, child: Child) -> Any:
        return self.value


@dataclass(frozen=True)
class Failed(ChildOutcome):
    """The child failed with the error text ``error``."""

    error: str

    def result(self, child: Child) -> Any:
        raise _errors.ChildFailed(child.run_id, self.error)


@dataclass(frozen=True)
class Cancelled(ChildOutcome):
    """The child was cancelled."""

    def result(self, child: Child) -> Any:
        raise _errors.ChildFailed(child.run_id, None)


ChildOutcome.Completed = Completed
ChildOutcome.Failed = Failed
ChildOutcome.Cancelled = Cancelled


def spawn(key: str, deployment: str, input: Any, *, detached: bool = False) -> Child:
    """Starts a run of the deployment ``deployment`` with ``input`` (as JSON), as a child
    of this run, exactly once: the child's id is derived from this run and ``key``, so a
    resumed instance spawning again under the same key gets the same child and starts
    nothing. The child runs with its deployment's grants, and is cancelled when this run
    is, unless ``detached``.

    ``key`` names the child among this run's spawns: derive it from what the child does
    (``"summarize-doc-17"``), never from the time or a counter of instances.

    Raises :class:`SpawnError` (an invalid key, an unknown deployment, a key spawned
    before with another deployment or input, a depth or children limit, an agent that
    would spawn itself for ever); :class:`CodecError` when ``input`` is not JSON.
    """
    data = _json.dumps(input, "child input")
    try:
        run_id = wit_children.spawn(key, deployment, data, bool(detached))
    except Err as err:
        raise_spawn_error(err)
    return Child(run_id)


@dataclass(frozen=True)
class ChildSpec:
    """A child for :func:`spawn_many`: its key, its deployment and its input (any JSON
    value), cancelled with this run unless ``detached``."""

    key: str
    deployment: str
    input: Any
    detached: bool = False


def spawn_many(specs: Sequence[ChildSpec]) -> list[Child | _errors.SpawnError]:
    """:func:`spawn` of each child, in order, in one write to the store: a fan-out over
    many items costs about one spawn, not one per child. Each child gets its own answer,
    as if each had been spawned on its own in this order: its :class:`Child`, or the
    :class:`SpawnError` refusing it (a refused one starts nothing, the others still
    start). At most the run's children limit in one call.

    Raises :class:`CodecError` when an input is not JSON (nothing is spawned then).
    """
    requests = [
        wit_children.SpawnRequest(
            spec.key, spec.deployment, _json.dumps(spec.input, "child input"), bool(spec.detached)
        )
        for spec in specs
    ]
    answers: list[Child | _errors.SpawnError] = []
    for answer in wit_children.spawn_many(requests):
        if isinstance(answer, Err):
            answers.append(spawn_error(answer.value))
        else:
            answers.append(Child(answer.value))
    return answers


def spawn_all(
    deployment: str, items: Iterable[tuple[str, Any]], *, detached: bool = False
) -> list[Child]:
    """:func:`spawn_many` of one child of ``deployment`` per ``(key, input)``, raising
    the first refusal (the children before and after it that were not refused are
    started all the same: spawning again with the same keys finds them)."""
    answers = spawn_many([ChildSpec(key, deployment, value, detached) for key, value in items])
    children: list[Child] = []
    for answer in answers:
        if isinstance(answer, _errors.SpawnError):
            raise answer
        children.append(answer)
    return children


def join(child: Child) -> ChildOutcome:
    """Waits for ``child`` to end and returns how it ended. The join is recorded under
    the key ``join-{child's run id}``, as the Rust SDK's ``join`` records it."""
    return join_all(f"join-{_child(child).run_id}", [child])[0]


def join_all(
    key: str, children: Sequence[Child], timeout: float | None = None
) -> list[ChildOutcome]:
    """Waits until every one of ``children`` has ended, for at most ``timeout`` seconds
    (``None``: for ever), holding no instance meanwhile, and returns their ends in the
    order given. The run is woken once, when the last one ends. Recorded under ``key``
    among the run's waits: reached again, it answers the same.

    Raises :class:`JoinTimedOut` when the timeout passed first (recorded too), and
    :class:`JoinError` for a list that is empty, too long, repeats a child or names a
    run that is not this run's child, a key used by another wait, or claims held.
    """
    ids = _ids(children)
    timeout_ms = None if timeout is None else _millis(timeout, "a join's timeout")
    try:
        ends = wit_children.join_all(key, ids, timeout_ms)
    except Err as err:
        raise_join_error(err)
    if ends is None:
        raise _errors.JoinTimedOut(key)
    return [_outcome(end) for end in ends]


def join_any(
    key: str, children: Sequence[Child], timeout: float | None = None
) -> tuple[int, ChildOutcome]:
    """Waits until the first of ``children`` ends, as :func:`join_all` does, and returns
    its place in ``children`` with how it ended."""
    ids = _ids(children)
    timeout_ms = None if timeout is None else _millis(timeout, "a join's timeout")
    try:
        end = wit_children.join_any(key, ids, timeout_ms)
    except Err as err:
        raise_join_error(err)
    if end is None:
        raise _errors.JoinTimedOut(key)
    return end.index, _outcome(end)


def _child(child: Any) -> Child:
    if not isinstance(child, Child):
        raise TypeError(
            f"a join takes the Child that spawn returned, got {type(child).__name__} "
            "(idem.Child(run_id) makes one from a run id)"
        )
    return child


def _ids(children: Sequence[Child]) -> list[str]:
    if isinstance(children, (str, Child)):
        raise TypeError("a join takes a sequence of children; join(child) joins one")
    return [_child(c).run_id for c in children]


def _outcome(end: wit_children.ChildEnd) -> ChildOutcome:
    status = end.status
    if status == wit_children.ChildStatus.COMPLETED:
        return Completed(_json.loads(bytes(end.output), f"output of child {end.run_id}"))
    if status == wit_children.ChildStatus.FAILED:
        return Failed(bytes(end.output).decode("utf-8", errors="replace"))
    return Cancelled()
