"""The SDK's exceptions: one class per way a durable call or the agent can fail."""

from __future__ import annotations


class IdemError(Exception):
    """Base of every exception the SDK raises."""


class _Refused(IdemError):
    """A refusal by the host: its kind (``prefix``) and the host's detail."""

    prefix = "refused"

    def __init__(self, detail: str) -> None:
        super().__init__(f"{self.prefix}: {detail}")
        self.detail = detail


class StepError(_Refused):
    """The host refused a durable call (``run_once``, ``commit``, ``save``)."""

    prefix = "step error"


class InvalidKey(StepError):
    """The key is empty, too long, or holds control or invisible characters."""

    prefix = "invalid key"


class TooLarge(StepError):
    """A result or checkpoint state is over the host's limit."""

    prefix = "too large"


class ClaimLost(StepError):
    """Another holder took the claim over before this commit; nothing was written."""

    prefix = "claim lost"


class AwaitTimeout(StepError):
    """Another live holder kept the key past the host's await limit."""

    prefix = "await timeout"


class InDoubt(StepError):
    """The key's claim is parked in doubt, waiting for ``idem resolve``."""

    prefix = "in doubt, waiting for idem resolve"


class KeyReused(StepError):
    """The key was committed for other input (a different fingerprint)."""

    prefix = "key reused with other input"


class WaitError(_Refused):
    """The host refused a wait (``sleep``, ``sleep_until``, ``wait_for_signal``);
    nothing was recorded."""

    prefix = "wait refused"


class InvalidWaitKey(WaitError):
    """The wait's key or signal name is empty, too long or holds control characters."""

    prefix = "invalid wait key"


class InvalidTime(WaitError):
    """The time asked for is before the Unix epoch or beyond what the host keeps."""

    prefix = "invalid time"


class WaitKeyReused(WaitError):
    """The key was used by another kind of wait (a sleep, or another signal)."""

    prefix = "wait key reused"


class ClaimsHeld(WaitError):
    """The instance holds claims: commit or release them before waiting."""

    prefix = "claims held"


class TimedOut(IdemError):
    """A wait for a signal ended at its timeout before the signal came."""

    def __init__(self, name: str) -> None:
        super().__init__(f"timed out waiting for signal {name!r}")
        self.name = name


class SpawnError(_Refused):
    """The host refused a :func:`~idem.spawn`; nothing was recorded and no child
    started."""

    prefix = "spawn refused"


class InvalidSpawnKey(SpawnError):
    """The spawn's key is empty, too long or holds control characters."""

    prefix = "invalid spawn key"


class UnknownDeployment(SpawnError):
    """No deployment has the name the spawn gave."""


class SpawnKeyReused(SpawnError):
    """The key was spawned before with another deployment or input."""


class SpawnTooLarge(SpawnError):
    """The child's input is over the host's limit."""


class SpawnLimit(SpawnError):
    """The child would pass the host's depth limit, or this run its children limit."""


class SpawnCycle(SpawnError):
    """An ancestor of this run was spawned with the same deployment and key: the agent
    would spawn itself for ever."""


class JoinError(_Refused):
    """The host refused a join (:func:`~idem.join`, :func:`~idem.join_all`,
    :func:`~idem.join_any`); nothing was recorded."""

    prefix = "join refused"


class InvalidJoinKey(JoinError):
    """The join's key is empty, too long or holds control characters."""

    prefix = "invalid join key"


class InvalidChildren(JoinError):
    """The list of children is empty, too long, or names a child twice."""


class NotAChild(JoinError):
    """A run the join listed is not a child of this run; ``run_id`` is its id."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f'run "{run_id}" is not a child of this run')
        self.run_id = run_id


class JoinKeyReused(JoinError):
    """The key was used by another wait, or by a join of other children."""


class InvalidJoinTime(JoinError):
    """The join's timeout is beyond what the host keeps."""


class JoinClaimsHeld(JoinError):
    """The instance holds claims: commit or release them before joining."""

    prefix = "cannot join while holding claims"


class JoinTimedOut(IdemError):
    """A join ended at its timeout before its children did; ``key`` is the join's key.
    Recorded too: a replay of the join times out again at once."""

    def __init__(self, key: str) -> None:
        super().__init__(f"timed out joining children under key {key!r}")
        self.key = key


class ChildFailed(IdemError):
    """A joined child did not complete: :meth:`~idem.ChildOutcome.result` of a child
    that failed (``error`` is its error text) or was cancelled (``error`` is ``None``)."""

    def __init__(self, run_id: str, error: str | None) -> None:
        if error is None:
            super().__init__(f"child {run_id} was cancelled")
        else:
            super().__init__(f"child {run_id} failed: {error}")
        self.run_id = run_id
        self.error = error


class EffectFailed(IdemError):
    """A step's side effect failed for good: :func:`~idem.run_once_retry` committed its
    last error as the step's result (the error was permanent, or the attempts were
    spent), and every later call with the key raises this again without running it."""

    def __init__(self, message: str) -> None:
        super().__init__(f"side effect failed: {message}")
        self.message = message


class CodecError(IdemError):
    """A value could not be encoded to, or decoded from, JSON."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"JSON: {detail}")


class ClaimSettled(IdemError):
    """A step's claim was used after it was committed, released or stopped."""


class HttpError(IdemError):
    """An outbound request could not be made; a response with any status is not this."""


class HttpDenied(HttpError):
    """The host refused the request: the destination is not granted, or the request
    was made outside a claim where that is not allowed."""


class UsageError(_Refused):
    """The host refused to record a model call's usage
    (:func:`idem.llm.record_usage`); nothing was recorded."""

    prefix = "usage refused"


class UnknownStep(UsageError):
    """The key is not a step this run committed: unknown, not committed yet, or
    committed by another run."""

    def __init__(self, key: str) -> None:
        super().__init__(f"key {key!r} is not a step this run committed")
        self.key = key


class InvalidUsage(UsageError):
    """The key or model name is empty, too long or holds control characters, or a
    count is over the host's bound."""


class LiveError(_Refused):
    """The host refused text published to the run's live stream
    (:func:`idem.publish`); nothing was published."""

    prefix = "publish refused"


class InvalidLiveKey(LiveError):
    """The key is empty, too long or holds control characters."""


class LiveTooLarge(LiveError):
    """The text is over the host's bound on one chunk (``bound``, in bytes)."""

    def __init__(self, bound: int) -> None:
        super().__init__(f"the text is over the host's bound of {bound} bytes")
        self.bound = bound


class LlmError(IdemError):
    """A model call of :mod:`idem.llm` failed. In every case but :class:`TurnLimit` the
    call's key is left uncommitted (its claim released): nothing the model answered was
    recorded, every earlier step stays committed, and running the agent again calls the
    model again for that turn."""


class MissingKey(LlmError):
    """The run was not granted the environment variable holding the model's API key."""

    def __init__(self, var: str) -> None:
        super().__init__(
            f"the model's API key is missing: environment variable {var} is not granted to "
            "the run (or is empty)"
        )
        self.var = var


class BadEndpoint(LlmError):
    """An environment variable naming the endpoint holds no http:// or https:// URL."""

    def __init__(self, var: str, value: str) -> None:
        super().__init__(f"environment variable {var} is not an http:// or https:// URL: {value!r}")
        self.var = var
        self.value = value


class ModelStatus(LlmError):
    """The model answered with an error status retrying does not cure (400, 401, ...)."""

    def __init__(self, url: str, status: int, body: str) -> None:
        super().__init__(f"the model at {url} refused the request with status {status}: {body}")
        self.url = url
        self.status = status
        self.body = body


class GaveUp(LlmError):
    """Every attempt the retry policy allows failed (429, a 5xx, a failed exchange)."""

    def __init__(self, key: str, attempts: int, last: str) -> None:
        super().__init__(
            f"the model call {key} gave up after {attempts} attempts; the last: {last}"
        )
        self.key = key
        self.attempts = attempts
        self.last = last


class Malformed(LlmError):
    """The response is not what the provider's API answers: not JSON, cut short, or
    missing a field the client needs."""

    def __init__(self, key: str, detail: str) -> None:
        super().__init__(f"malformed model response to {key}: {detail}")
        self.key = key
        self.detail = detail


class ResponseTooLarge(LlmError):
    """The response body is over the client's limit or the host's result limit."""

    def __init__(self, key: str, detail: str) -> None:
        super().__init__(f"the model's response to {key} is too large: {detail}")
        self.key = key
        self.detail = detail


class TurnLimit(LlmError):
    """The model still asked for tools after the tool loop's turn limit."""

    def __init__(self, conversation: str, turns: int) -> None:
        super().__init__(f"conversation {conversation} still calls tools after {turns} model turns")
        self.conversation = conversation
        self.turns = turns
