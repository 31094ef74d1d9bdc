"""Model calls as durable steps: a small client for OpenAI-compatible chat completions
and Anthropic Messages, over :mod:`idem.http`. The Rust SDK's ``idem_sdk::llm``, with
the same keys, requests and behaviour.

Each :meth:`Client.complete` is one step keyed by the conversation's id and its turn
(``{run_id}/llm/{conversation}/{turn}``, bound to the request's content): the whole
response body is the step's committed result, so an instance that replays its way back
to the call gets the same bytes back without reaching the model. :meth:`Client.run_tools`
is the tool-call loop: model, then the tools it asked for (each its own step, claimed
together with :func:`~idem.run_once_all`), then the model again, until it stops asking
or the turn limit is reached.

The endpoint and the API key come from the run's grants (``idem run --env
OPENAI_API_KEY=... --allow-http api.openai.com``), never from the component. A 429 or a
5xx is retried under the client's :class:`~idem.RetryPolicy`, waiting as
``Retry-After`` says (a durable :func:`~idem.sleep`: the run holds no instance
meanwhile).

With ``Client(..., stream=True)`` a call asks for a stream and publishes each piece of
text on the run's live stream under the call's key as it arrives
(:func:`~idem.publish`: ``idem logs -f``, ``GET /api/runs/{id}/stream`` and the web page
show it growing); the step still commits the response the same call would have answered
without streaming, so a replay returns it byte for byte and publishes nothing.

>>> import idem
>>> from idem import llm
>>> def support(input):
...     client = llm.Client.openai("gpt-4o-mini")
...     chat = llm.Conversation("ticket-4711")
...     chat.system("You answer support tickets.")
...     chat.user("Where is my parcel 12345?")
...     track = llm.Tool("track", "Where a parcel is", {"type": "object"})
...     reply = client.run_tools(chat, [track], 8, lambda call, step: "in Oslo")
...     return {"answer": reply.message.content, "tokens": reply.usage.output_tokens}
"""

from __future__ import annotations

import contextlib
import enum
import json as _jsonlib
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import _errors, http
from ._errors import (
    BadEndpoint,
    GaveUp,
    HttpDenied,
    HttpError,
    InvalidUsage,
    LiveError,
    LlmError,
    Malformed,
    MissingKey,
    ModelStatus,
    ResponseTooLarge,
    TurnLimit,
    UnknownStep,
    UsageError,
)
from ._host import Err, raise_step_error, run_id, types
from ._host import once as wit_once
from ._host import usage as wit_usage
from ._keys import Key
from ._live import MAX_CHUNK_BYTES, publish
from ._llm_stream import Assembler, stream_request
from ._once import Outcome, Step, obtained, step_of
from ._once_all import run_once_all
from ._retry import RetryPolicy, _random, backoff_key
from ._waits import sleep_ms

__all__ = [
    "MAX_RESPONSE_BYTES",
    "BadEndpoint",
    "Client",
    "Conversation",
    "GaveUp",
    "InvalidUsage",
    "LlmError",
    "Malformed",
    "Message",
    "MissingKey",
    "ModelStatus",
    "Provider",
    "Recorded",
    "Reply",
    "ResponseTooLarge",
    "Tool",
    "ToolCall",
    "TurnLimit",
    "UnknownStep",
    "Usage",
    "UsageError",
    "record_usage",
]

#: The default of ``Client(max_response_bytes=...)``: far over any model's answer,
#: and far under the host's limit on a step's result (64 MiB by default).
MAX_RESPONSE_BYTES = 1 << 20


class Provider(enum.Enum):
    """Which API the endpoint speaks."""

    #: OpenAI's chat completions (``POST {base}/chat/completions``).
    OPENAI = "openai"
    #: Anthropic's Messages API (``POST {base}/v1/messages``).
    ANTHROPIC = "anthropic"


@dataclass(frozen=True)
class ToolCall:
    """A call of a :class:`Tool` the model asked for; ``arguments`` is JSON text as the
    model wrote it, unchecked."""

    id: str
    name: str
    arguments: str

    def args(self) -> Any:
        """The arguments decoded from JSON; raises :class:`~idem.CodecError` when the
        model wrote something else.

        >>> ToolCall("c1", "weather", '{"city": "Oslo"}').args()["city"]
        'Oslo'
        """
        try:
            return _jsonlib.loads(self.arguments)
        except ValueError as err:
            raise _errors.CodecError(f"arguments of tool call {self.id}: {err}") from None


@dataclass
class Message:
    """One message of a :class:`Conversation`: ``role`` is ``system``, ``user``,
    ``assistant`` or ``tool`` (a result, answering call ``tool_call_id``)."""

    role: str
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None

    @classmethod
    def system(cls, content: str) -> Message:
        return cls("system", content)

    @classmethod
    def user(cls, content: str) -> Message:
        return cls("user", content)

    @classmethod
    def assistant(cls, content: str) -> Message:
        return cls("assistant", content)

    @classmethod
    def tool(cls, call_id: str, content: str) -> Message:
        return cls("tool", content, tool_call_id=call_id)


@dataclass(frozen=True)
class Tool:
    """A tool the model may call; ``parameters`` is the JSON Schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class Usage:
    """The tokens a response reports: prompt (``input_tokens``), generated
    (``output_tokens``) and prompt tokens served from the provider's cache
    (``cached_tokens``).

    >>> Usage(1, 2, 3) + Usage(10, 20, 30)
    Usage(input_tokens=11, output_tokens=22, cached_tokens=33)
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cached_tokens + other.cached_tokens,
        )


class Recorded(enum.Enum):
    """How :func:`record_usage` counted a call's tokens."""

    #: The step's first recording: its tokens count as spent.
    SPENT = "spent"
    #: The step was recorded before (this call was a replay, which made no request):
    #: its tokens count as saved.
    SAVED = "saved"


def record_usage(key: str, model: str, usage: Usage) -> Recorded:
    """Records ``usage``, what the response committed under ``key`` (a step of this
    run) reported for ``model``, with the step in the store: ``idem show``, the web page
    and ``/metrics`` sum it per run, deployment and model. The first recording of a key
    counts as spent, every later one (a replay) as saved, so the tokens are spent once
    however many instances replay the call, and whether or not the instance that
    committed it lived to record it. :meth:`Client.complete` calls it after every call,
    fresh or replayed; an agent calls it for model calls it makes itself.

    Raises :class:`UnknownStep` for a key this run did not commit, and
    :class:`InvalidUsage` for an empty or overlong model name or a count over the
    host's bound; nothing is recorded then.
    """
    tokens = wit_usage.Tokens(usage.input_tokens, usage.output_tokens, usage.cached_tokens)
    try:
        got = wit_usage.record_usage(key, model, tokens)
    except Err as err:
        value = err.value
        if isinstance(value, wit_usage.UsageError_UnknownStep):
            raise UnknownStep(value.value) from None
        raise InvalidUsage(value.value) from None
    return Recorded.SPENT if got == wit_usage.Recorded.SPENT else Recorded.SAVED


class Conversation:
    """A conversation: its id (which names its steps) and its messages so far. Build it
    the same way on every instance: its turns are counted from the start. The id is
    unique within the run and stable across its instances (``"ticket-4711"``, never a
    time or a counter of attempts)."""

    def __init__(self, id: str) -> None:
        self.id = id
        self.messages: list[Message] = []
        #: Model calls made so far: the next call is turn ``turn + 1``.
        self.turn = 0

    def system(self, content: str) -> Conversation:
        return self.push(Message.system(content))

    def user(self, content: str) -> Conversation:
        return self.push(Message.user(content))

    def push(self, message: Message) -> Conversation:
        self.messages.append(message)
        return self


@dataclass(frozen=True)
class Reply:
    """The model's answer to one call."""

    #: The assistant message (also appended to the conversation).
    message: Message
    #: Why the model stopped, in the provider's words (``stop``, ``tool_calls``,
    #: ``end_turn``, ...).
    stop_reason: str
    #: The tokens this response reports (for :meth:`Client.run_tools`, summed over its
    #: model calls).
    usage: Usage
    #: The response body, exactly as the model sent it the one time it was called.
    body: str
    #: How the step got it: ``Outcome.SKIPPED`` for a replay, which cost nothing.
    outcome: Outcome
    #: The call's turn in its conversation (1 for the first).
    turn: int
    #: The call's key.
    key: str


@dataclass
class _Parsed:
    message: Message
    stop_reason: str
    usage: Usage


class _Again(Exception):
    """An attempt worth repeating (429, 5xx, a failed exchange)."""

    def __init__(self, why: str, after: float | None) -> None:
        super().__init__(why)
        self.why = why
        self.after = after


class Client:
    """A model endpoint: provider, URL, key, model and the call's policies.

    ``max_tokens`` bounds each response (default 1024); ``retry`` says how 429s, 5xx
    and failed exchanges are retried, a ``Retry-After`` (or ``retry-after-ms``) of the
    response replacing the policy's wait up to its ``max_delay``;
    ``max_response_bytes`` is the largest body accepted (raise the host's result limit
    with it); ``timeout`` (seconds) bounds each request's waits.

    ``stream=True`` streams each call: the request asks for server-sent events
    (OpenAI's ``stream`` with ``stream_options.include_usage``, Anthropic's ``stream``),
    and each piece of text is published on the run's live stream under the call's key
    as it arrives (:func:`~idem.publish`). What the step commits is the response
    assembled from the events, in the shape the same call answers without streaming
    (message, tool calls, stop reason, usage): a replay decodes it alike, returns it
    byte for byte and publishes nothing (the text was shown when the call was made).
    The call's key is bound to the request without the stream fields, so turning
    streaming on or off does not change it. An attempt that fails midway and is
    retried publishes its text again.
    """

    def __init__(
        self,
        provider: Provider,
        model: str,
        *,
        base_url_var: str,
        api_key_var: str,
        max_tokens: int = 1024,
        retry: RetryPolicy | None = None,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        timeout: float | None = None,
        stream: bool = False,
    ) -> None:
        key = os.environ.get(api_key_var, "")
        if not key:
            raise MissingKey(api_key_var)
        base = os.environ.get(base_url_var, "") or (
            "https://api.openai.com/v1"
            if provider == Provider.OPENAI
            else "https://api.anthropic.com"
        )
        if not base.lower().startswith(("http://", "https://")):
            raise BadEndpoint(base_url_var, base)
        self.provider = provider
        self.model = model
        self.base_url = base.rstrip("/")
        self._api_key = key
        self.max_tokens = max_tokens
        self.retry = retry or RetryPolicy()
        self.max_response_bytes = max_response_bytes
        self.timeout = timeout
        self.stream = stream

    def __repr__(self) -> str:
        # The key stays out of logs and tracebacks.
        return (
            f"Client({self.provider.value}, {self.model!r}, base_url={self.base_url!r}, "
            "api_key=<granted>)"
        )

    @classmethod
    def openai(cls, model: str, **kw: Any) -> Client:
        """An OpenAI-compatible endpoint: the key from the granted environment variable
        ``OPENAI_API_KEY``, the base URL from ``OPENAI_BASE_URL`` (default
        ``https://api.openai.com/v1``). Raises :class:`MissingKey` without the key."""
        return cls(
            Provider.OPENAI,
            model,
            base_url_var="OPENAI_BASE_URL",
            api_key_var="OPENAI_API_KEY",
            **kw,
        )

    @classmethod
    def anthropic(cls, model: str, **kw: Any) -> Client:
        """Anthropic's API: the key from ``ANTHROPIC_API_KEY``, the base URL from
        ``ANTHROPIC_BASE_URL`` (default ``https://api.anthropic.com``)."""
        return cls(
            Provider.ANTHROPIC,
            model,
            base_url_var="ANTHROPIC_BASE_URL",
            api_key_var="ANTHROPIC_API_KEY",
            **kw,
        )

    @property
    def url(self) -> str:
        """The URL requests go to."""
        if self.provider == Provider.OPENAI:
            return f"{self.base_url}/chat/completions"
        return f"{self.base_url}/v1/messages"

    def complete(self, chat: Conversation, tools: Sequence[Tool] = ()) -> Reply:
        """Asks the model for the next turn of ``chat``, offering ``tools``, as one step:
        the reply's message is appended to ``chat``, and its tool calls (if any) are the
        caller's to run. Reached again on a later instance, the call returns the
        committed response without a request.

        Raises :class:`LlmError` (the claim released, nothing recorded) for an error
        status, retries spent, or a malformed or too large response;
        :class:`~idem.KeyReused` when a replay sends other messages for a committed
        turn.
        """
        turn = chat.turn + 1
        body = request_body(self.provider, self.model, self.max_tokens, chat.messages, tools)
        key = Key(f"{run_id()}/llm/{chat.id}/{turn}").with_input(body)
        sent = stream_request(self.provider == Provider.OPENAI, body) if self.stream else body
        raw, outcome = self._call(key, sent)
        try:
            parsed = parse(self.provider, raw.encode("utf-8"))
        except ValueError as err:
            raise Malformed(key.text, str(err)) from None
        # Fresh or replayed: the host counts the first recording of the key as spent
        # and any later one as saved.
        record_usage(key.text, self.model, parsed.usage)
        chat.turn = turn
        chat.messages.append(parsed.message)
        return Reply(parsed.message, parsed.stop_reason, parsed.usage, raw, outcome, turn, key.text)

    def run_tools(
        self,
        chat: Conversation,
        tools: Sequence[Tool],
        max_turns: int,
        tool: Callable[[ToolCall, Step], str],
    ) -> Reply:
        """The tool-call loop: asks the model, runs each tool call it makes with
        ``tool(call, step)`` (each call its own step, keyed ``{call key}/tool/{call id}``,
        claimed together with the turn's other calls), appends their results and asks
        again, until a reply calls no tool. Returns that reply, its ``usage`` summed over
        the loop's model calls.

        ``tool`` returns the result's text for the model (return an error *as text* to
        let the model see it); an exception releases that call's claim and propagates,
        the turn's other calls committed. More than ``max_turns`` model calls raise
        :class:`TurnLimit`.
        """

        def each(calls: list[tuple[ToolCall, Step]]) -> list[Any]:
            out: list[Any] = []
            for call, step in calls:
                try:
                    out.append(tool(call, step))
                except Exception as exc:
                    out.append(exc)
            return out

        return self.run_tools_all(chat, tools, max_turns, each)

    def run_tools_all(
        self,
        chat: Conversation,
        tools: Sequence[Tool],
        max_turns: int,
        tools_fn: Callable[[list[tuple[ToolCall, Step]]], Sequence[Any]],
    ) -> Reply:
        """:meth:`run_tools` with the turn's tool calls handed over together, so that
        their effects can be in flight at once (with :func:`idem.http.send_all`, each
        request ``under=step``): ``tools_fn`` gets the calls not yet committed with
        their steps and returns one result per call, in their order (an exception in
        place of a result fails that call)."""
        usage = Usage()
        for _ in range(max_turns):
            reply = self.complete(chat, tools)
            usage = usage + reply.usage
            calls = reply.message.tool_calls
            if not calls:
                return Reply(
                    reply.message,
                    reply.stop_reason,
                    usage,
                    reply.body,
                    reply.outcome,
                    reply.turn,
                    reply.key,
                )
            keys = [Key(f"{reply.key}/tool/{c.id}") for c in calls]
            by_key = {k.text: c for k, c in zip(keys, calls, strict=True)}

            def pending(steps: list[Step], by_key: dict[str, ToolCall] = by_key) -> Sequence[Any]:
                return tools_fn([(by_key[s.key], s) for s in steps])

            results = run_once_all(keys, pending)
            for call, (result, _) in zip(calls, results, strict=True):
                chat.push(Message.tool(call.id, str(result)))
        raise TurnLimit(chat.id, max_turns)

    def _call(self, key: Key, body: str) -> tuple[str, Outcome]:
        """The step of one model call: the committed body, or the body of the request
        that got through, committed."""
        while True:
            try:
                got = wit_once.run_once(key.text, key.fingerprint)
            except Err as err:
                raise_step_error(err)
            if isinstance(got, wit_once.Outcome_Committed):
                try:
                    return got.value.value.decode("utf-8"), obtained(got.value)
                except UnicodeDecodeError:
                    raise Malformed(key.text, "the committed response is not UTF-8") from None
            claim = got.value
            step = step_of(claim)
            try:
                raw = self._attempt(key, step, body)
            except _Again as again:
                wit_once.Claim.release(claim)
                if step.attempt >= max(self.retry.max_attempts, 1):
                    raise GaveUp(key.text, step.attempt, again.why) from None
                if again.after is not None:
                    delay = min(round(again.after * 1000), round(self.retry.max_delay * 1000))
                else:
                    delay = self.retry.delay_ms(step.attempt, _random())
                # Kept in the run's log (`idem logs`): why the call is waiting.
                print(
                    f"attempt {step.attempt} of {key} failed: {again.why}; retrying in {delay} ms",
                    file=sys.stderr,
                )
                sleep_ms(backoff_key(key, step.attempt), delay)
                continue
            except BaseException:
                wit_once.Claim.release(claim)
                raise
            try:
                wit_once.Claim.commit(claim, raw.encode("utf-8"), None)
            except Err as err:
                # Taken over while the request ran: the taker's commit is the answer.
                if isinstance(err.value, types.StepError_ClaimLost):
                    continue
                if isinstance(err.value, types.StepError_TooLarge):
                    raise ResponseTooLarge(
                        key.text, f"the host refused it as a step's result: {err.value.value}"
                    ) from None
                raise_step_error(err)
            return raw, Outcome.RECLAIMED if step.in_doubt else Outcome.EXECUTED

    def _attempt(self, key: Key, step: Step, body: str) -> str:
        """One request under ``step``: the body to commit; raises :class:`_Again` or
        :class:`LlmError`."""
        headers = {"content-type": "application/json"}
        if self.provider == Provider.OPENAI:
            headers["authorization"] = f"Bearer {self._api_key}"
        else:
            headers["x-api-key"] = self._api_key
            headers["anthropic-version"] = "2023-06-01"
        assembler = Assembler(self.provider == Provider.OPENAI) if self.stream else None

        def on_body(status: int, piece: bytes) -> None:
            if assembler is not None and 200 <= status < 300:
                for delta in assembler.feed(piece):
                    _publish_text(key.text, delta)

        try:
            r = http.request(
                "POST",
                self.url,
                headers=headers,
                body=body,
                timeout=self.timeout,
                under=step,
                on_body=on_body,
            )
        except HttpDenied:
            raise
        except HttpError as err:
            raise _Again(str(err), None) from None
        if r.status == 429 or r.status >= 500:
            raise _Again(f"status {r.status}", retry_after(r))
        if not r.ok:
            raise ModelStatus(self.url, r.status, r.text[:500])
        answer = r.body
        if assembler is not None:
            # What the step commits: the events assembled into the plain response.
            try:
                answer = assembler.finish().encode("utf-8")
            except ValueError as err:
                raise Malformed(key.text, f"the stream: {err}") from None
        if len(answer) > self.max_response_bytes:
            raise ResponseTooLarge(
                key.text,
                f"{len(answer)} bytes, over the client's limit of {self.max_response_bytes} bytes",
            )
        # Checked before the commit: a body that does not decode is never recorded.
        try:
            parse(self.provider, answer)
            return answer.decode("utf-8")
        except (ValueError, UnicodeDecodeError) as err:
            raise Malformed(key.text, str(err)) from None


def _publish_text(key: str, text: str) -> None:
    """Publishes a streamed call's ``text`` under its ``key``, in pieces within the
    host's bound. A refusal is dropped: the live stream is a view of the call, and must
    not fail it (the key was checked when it was claimed; pieces are within the bound)."""
    data = text.encode("utf-8")
    while data:
        cut = min(len(data), MAX_CHUNK_BYTES)
        # Back to a character's first byte: a piece is whole characters.
        while cut < len(data) and (data[cut] & 0xC0) == 0x80:
            cut -= 1
        with contextlib.suppress(LiveError):
            publish(key, data[:cut].decode("utf-8"))
        data = data[cut:]


def retry_after(r: http.Response) -> float | None:
    """The wait in seconds a 429 or 503 asks for: ``retry-after-ms`` or ``Retry-After``
    in seconds. An HTTP date is not read: the policy's wait applies.

    >>> retry_after(http.Response(429, [("retry-after", b"2")]))
    2.0
    >>> retry_after(http.Response(429, [("retry-after", b"2"), ("retry-after-ms", b"150")]))
    0.15
    >>> retry_after(http.Response(429, [("retry-after", b"Wed, 21 Oct 2015 07:28:00 GMT")]))
    """
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = r.header(name)
        if value is None:
            continue
        try:
            seconds = float(value.strip()) / scale
        except ValueError:
            continue
        if math.isfinite(seconds) and seconds >= 0:
            return min(seconds, 1e9)
    return None


def _dumps(value: Any) -> str:
    return _jsonlib.dumps(value, separators=(",", ":"), ensure_ascii=False)


def request_body(
    provider: Provider,
    model: str,
    max_tokens: int,
    messages: Sequence[Message],
    tools: Sequence[Tool],
) -> str:
    """The request body for ``model`` to continue ``messages``, with ``tools`` offered."""
    if provider == Provider.OPENAI:
        out: list[dict[str, Any]] = []
        for m in messages:
            o: dict[str, Any] = {"role": m.role, "content": m.content}
            if m.tool_calls:
                o["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments},
                    }
                    for c in m.tool_calls
                ]
            if m.tool_call_id is not None:
                o["tool_call_id"] = m.tool_call_id
            out.append(o)
        body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "messages": out}
        if tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters,
                    },
                }
                for t in tools
            ]
        return _dumps(body)
    system = [m.content for m in messages if m.role == "system"]
    turns: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "system":
            continue
        if m.role == "tool":
            block = {
                "type": "tool_result",
                "tool_use_id": m.tool_call_id or "",
                "content": m.content,
            }
            last = turns[-1] if turns else None
            # Anthropic takes tool results as blocks of a user message; consecutive
            # results (one turn's parallel calls) share one.
            if last and last["role"] == "user" and last["content"][0]["type"] == "tool_result":
                last["content"].append(block)
            else:
                turns.append({"role": "user", "content": [block]})
        elif m.role == "assistant":
            blocks: list[dict[str, Any]] = []
            if m.content:
                blocks.append({"type": "text", "text": m.content})
            for c in m.tool_calls:
                try:
                    args = _jsonlib.loads(c.arguments)
                except ValueError:
                    args = {}
                blocks.append({"type": "tool_use", "id": c.id, "name": c.name, "input": args})
            turns.append({"role": "assistant", "content": blocks})
        else:
            turns.append({"role": "user", "content": [{"type": "text", "text": m.content}]})
    body = {"model": model, "max_tokens": max_tokens, "messages": turns}
    if system:
        body["system"] = "\n\n".join(system)
    if tools:
        body["tools"] = [
            {"name": t.name, "description": t.description, "input_schema": t.parameters}
            for t in tools
        ]
    return _dumps(body)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what}: expected a string, got {value!r}")
    return value


def parse(provider: Provider, body: bytes) -> _Parsed:
    """Decodes a response body; raises ``ValueError`` saying what is wrong with it."""
    try:
        r = _jsonlib.loads(body.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ValueError(f"not UTF-8: {err}") from None
    if not isinstance(r, dict):
        raise ValueError("the body is not a JSON object")
    got = r.get("usage")
    usage: dict[str, Any] = got if isinstance(got, dict) else {}
    if provider == Provider.OPENAI:
        choices = r.get("choices")
        if not isinstance(choices, list):
            raise ValueError("missing field `choices`")
        if not choices or not isinstance(choices[0], dict):
            raise ValueError("`choices` is empty")
        message = choices[0].get("message")
        if not isinstance(message, dict):
            raise ValueError("missing field `message`")
        content = message.get("content")
        calls = []
        for c in message.get("tool_calls") or []:
            f = c.get("function") if isinstance(c, dict) else None
            if not isinstance(f, dict):
                raise ValueError(f"a tool call without a function: {c!r}")
            calls.append(
                ToolCall(
                    _str(c.get("id"), "tool call id"),
                    _str(f.get("name"), "tool name"),
                    _str(f.get("arguments"), "tool arguments"),
                )
            )
        details = usage.get("prompt_tokens_details")
        return _Parsed(
            Message("assistant", content if isinstance(content, str) else "", calls),
            str(choices[0].get("finish_reason") or ""),
            Usage(
                _int(usage.get("prompt_tokens")),
                _int(usage.get("completion_tokens")),
                _int(details.get("cached_tokens")) if isinstance(details, dict) else 0,
            ),
        )
    blocks = r.get("content")
    if not isinstance(blocks, list):
        raise ValueError("missing field `content`")
    text = []
    calls = []
    for b in blocks:
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text":
            text.append(_str(b.get("text"), "text"))
        elif kind == "tool_use":
            calls.append(
                ToolCall(
                    _str(b.get("id"), "tool_use id"),
                    _str(b.get("name"), "tool_use name"),
                    _dumps(b.get("input")),
                )
            )
    return _Parsed(
        Message("assistant", "".join(text), calls),
        str(r.get("stop_reason") or ""),
        Usage(
            _int(usage.get("input_tokens")),
            _int(usage.get("output_tokens")),
            _int(usage.get("cache_read_input_tokens")),
        ),
    )
