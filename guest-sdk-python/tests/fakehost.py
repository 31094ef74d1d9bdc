"""A fake host behind the real bindings, so the SDK's own logic runs on CPython.

The SDK calls the bindings componentize-py generates from ``wit/`` (``wit_world``,
``componentize_py_types``). Their types (the outcome and error variants, ``Err``, the
HTTP enums) are used here as generated; only the functions and resources that would
call into the host are replaced, while a test runs, by :class:`FakeHost`: an in-memory
store of keys, claims, checkpoints, waits, signals and child runs, and an HTTP
"server" function. A host call that would end the instance (a sleep not yet due, a join
whose children have not ended, a claim stopped in doubt)
raises :class:`InstanceEnded`, which no agent code catches; the test then "resumes" by
calling the agent again, as the host would on a fresh instance.

The bindings are found on the path, or in ``IDEM_PY_BINDINGS``, or generated into a
temporary folder with the ``componentize-py`` next to this Python (the venv
``scripts/test`` makes). The SDK is imported from this checkout's ``src/``, never from
an installed copy, and without writing ``__pycache__`` into it (the tests' build script
watches it).
"""

from __future__ import annotations

import atexit
import importlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import unittest
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

SDK = pathlib.Path(__file__).resolve().parents[1]
SRC = SDK / "src"


def _bindings() -> None:
    """Puts componentize-py's bindings for the `agent` world on the path."""
    given = os.environ.get("IDEM_PY_BINDINGS")
    if given:
        sys.path.insert(0, given)
        return
    try:
        importlib.import_module("wit_world")
        return
    except ImportError:
        pass
    exe = pathlib.Path(sys.executable).parent / "componentize-py"
    tool = str(exe) if exe.is_file() else shutil.which("componentize-py")
    if tool is None:
        raise RuntimeError(
            "the SDK's unit tests need the bindings componentize-py generates: run them "
            "with the Python of the venv scripts/test makes (target/py/bin/python), or set "
            "IDEM_PY_BINDINGS to the output of `componentize-py -d wit -w agent bindings DIR`"
        )
    out = tempfile.mkdtemp(prefix="idem-bindings-")
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    subprocess.run(
        [tool, "-d", str(SRC / "idem" / "wit"), "-w", "agent", "bindings", out],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    sys.path.insert(0, out)


sys.dont_write_bytecode = True
_bindings()
sys.path.insert(0, str(SRC))
for _name in [m for m in sys.modules if m == "idem" or m.startswith("idem.")]:
    del sys.modules[_name]

from componentize_py_types import Err, Ok  # noqa: E402
from wit_world.imports import (  # noqa: E402
    children,
    live,
    once,
    outbound,
    outgoing_handler,
    poll,
    progress,
    run_info,
    streams,
    usage,
    waits,
)
from wit_world.imports import idem_agent_types as types  # noqa: E402
from wit_world.imports import wasi_http_types as http_types  # noqa: E402

import idem  # noqa: E402

assert pathlib.Path(idem.__file__).is_relative_to(SRC), idem.__file__


class InstanceEnded(BaseException):
    """The host ended the instance inside a call (it never returns to the agent).

    In a component that is a trap, which runs no more of the agent's code; here it is
    an exception, which runs the ``except`` and ``finally`` blocks it unwinds through,
    so every host call of an ended instance raises it again and does nothing.
    """


@dataclass
class KeyState:
    """A key in the fake store."""

    attempts: int = 0
    token: int = 0
    committed: bytes | None = None
    fingerprint: str | None = None
    #: The claim held now, if any.
    holder: FakeClaim | None = None
    #: A holder died (its instance ended) before committing.
    in_doubt: bool = False
    #: Parked in doubt by `stop`, with its reason.
    parked: str | None = None


@dataclass
class FakeChild:
    """A child run in the fake store: how it was spawned, and how it ended."""

    key: str
    deployment: str
    input: bytes
    detached: bool
    #: `None` while it runs; then its status and output (its error text when failed).
    end: tuple[children.ChildStatus, bytes] | None = None
    #: When it ended among the run's children (the first to end is 1).
    ended_as: int = 0


@dataclass
class Request:
    """A request as the fake server received it."""

    method: Any
    scheme: Any
    authority: str | None
    path: str | None
    headers: list[tuple[str, bytes]]
    options: dict[str, int]
    body: bytes = b""
    writes: list[int] = field(default_factory=list)

    def header(self, name: str) -> str | None:
        for k, v in self.headers:
            if k == name:
                return v.decode()
        return None


class FakeHost:
    """The host's side of every import the SDK calls, in memory.

    ``refuse[op] = error`` makes the next call of ``op`` (``run_once``, ``commit``,
    ``save``, ``sleep``, ``wait``, ``spawn``, ``join``, ``take_token``,
    ``run_once_rated``) fail with that WIT error value.
    """

    def __init__(self, run_id: str = "run-1") -> None:
        self.run_id = run_id
        self.generation = 0
        self.now_ms = 0
        self.keys: dict[str, KeyState] = {}
        self.checkpoint: progress.Checkpoint | None = None
        self.saves: list[tuple[int, bytes]] = []
        self.sleeps: dict[str, int] = {}
        #: Rate classes with a limit: the milliseconds between two tokens.
        self.rates: dict[str, int] = {}
        #: When each limited class's next token is free.
        self.next_token: dict[str, int] = {}
        #: Tokens by wait key (`rate:` and the step's key): when each is due.
        self.tokens: dict[str, int] = {}
        self.signals: dict[str, list[bytes]] = {}
        self.received: dict[str, bytes | None] = {}
        self.calls: list[tuple[Any, ...]] = []
        self.refuse: dict[str, Any] = {}
        self.header_names = ("idempotency-key", "idempotency-token")
        self.denial: str | None = None
        self.http_outside_claims = False
        self.server: Callable[[Request], Any] = lambda _: (200, [], b"")
        self.requests: list[Request] = []
        #: Called inside `commit` before it takes effect (to take the claim over, say).
        self.before_commit: Callable[[str], None] | None = None
        self.ended: str | None = None
        #: Claims one instance may hold at once.
        self.max_claims = 64
        #: The (key, token) `stamp_next_request` tied the next request to.
        self.tied_next: tuple[str, int] | None = None
        #: ("handle", key) and ("response", key) in the order they happened.
        self.events: list[tuple[str, str | None]] = []
        #: The deployments a spawn may name.
        self.deployments: set[str] = set()
        #: This run's children by run id, in the order they were spawned.
        self.children: dict[str, FakeChild] = {}
        #: Children one run may spawn.
        self.max_children = 10_000
        #: Joins by key: the children listed, the mode, and the recorded answer (a
        #: list of ends, or `None` for a timeout) once the join is over.
        self.joins: dict[str, tuple[list[str], str, list[children.ChildEnd] | None]] = {}
        #: When each join not yet over times out (ms, on `now_ms`), if it does.
        self.join_deadlines: dict[str, int | None] = {}
        #: Usage recorded by key: the model, the tokens, and the replays counted since.
        self.usage: dict[str, tuple[str, usage.Tokens, int]] = {}
        #: Text published to the run's live stream: (key, text), in order.
        self.published: list[tuple[str, str]] = []

    def publish(self, key: str, text: str) -> None:
        """As the host does: a bad key or a text over the bound is refused; empty text
        publishes nothing."""
        self.calls.append(("publish", key, text))
        if not key or len(key.encode()) > 512 or any(ord(c) < 0x20 for c in key):
            raise Err(live.LiveError_InvalidKey(f"bad key {key!r}"))
        if len(text.encode()) > 16 << 10:
            raise Err(live.LiveError_TooLarge(16 << 10))
        if text:
            self.published.append((key, text))

    def record_usage(self, key: str, model: str, tokens: usage.Tokens) -> usage.Recorded:
        """As the host does: a committed key's first recording is spent, later ones
        saved; a key not committed, a bad model name or an absurd count is refused."""
        self.calls.append(("record_usage", key, model, tokens))
        state = self.keys.get(key)
        if state is None or state.committed is None:
            raise Err(usage.UsageError_UnknownStep(key))
        if not model or len(model.encode()) > 200:
            raise Err(usage.UsageError_Invalid(f"bad model name {model!r}"))
        if max(tokens.input, tokens.output, tokens.cached) > 1_000_000_000:
            raise Err(usage.UsageError_Invalid("a count is over the limit"))
        if key in self.usage:
            first, recorded, replays = self.usage[key]
            self.usage[key] = (first, recorded, replays + 1)
            return usage.Recorded.SAVED
        self.usage[key] = (model, tokens, 0)
        return usage.Recorded.SPENT

    # The instance: each `resume` is a fresh one, as after a crash or a wake-up.
    def resume(self, body: Callable[[], Any]) -> Any:
        """Runs ``body`` as one instance; returns its result, or ``InstanceEnded``."""
        try:
            return body()
        except InstanceEnded as ended:
            return ended
        finally:
            self.end_instance()
            self.generation += 1

    def end(self, why: str) -> InstanceEnded:
        """Ends the instance: the exception to raise, and every later call raises it."""
        self.ended = why
        return InstanceEnded(why)

    def crash(self, *_: object) -> None:
        """The instance dies here (a kill, a trap)."""
        raise self.end("crash")

    def end_instance(self) -> None:
        """What the host does with the claims of an instance that ended."""
        self.ended = None
        for state in self.keys.values():
            if state.holder is not None and state.parked is None:
                state.holder = None
                state.in_doubt = True

    def _refused(self, op: str) -> None:
        if self.ended is not None:
            raise InstanceEnded(self.ended)
        error = self.refuse.pop(op, None)
        if error is not None:
            raise Err(error)

    # idem:agent/once
    def run_once(self, key: str, fingerprint: str | None, durability: Any = None) -> Any:
        self.calls.append(("run_once", key, fingerprint, durability))
        self._refused("run_once")
        state = self.keys.setdefault(key, KeyState())
        if state.committed is not None:
            if state.fingerprint is not None and fingerprint != state.fingerprint:
                raise Err(types.StepError_KeyReused(f"{key} was committed for other input"))
            return once.Outcome_Committed(once.Committed(state.committed, once.Obtained.SKIPPED))
        if state.parked is not None:
            raise Err(types.StepError_InDoubt(f"{key}: {state.parked}"))
        if state.holder is not None:
            raise Err(types.StepError_AwaitTimeout(f"{key} is held by another instance"))
        state.attempts += 1
        state.token += 1
        state.fingerprint = fingerprint
        claim = FakeClaim(self, key, state.attempts, state.token, state.in_doubt)
        state.holder = claim
        return once.Outcome_Claimed(claim)

    def run_once_rated(
        self, key: str, fingerprint: str | None, durability: Any, rate_class: str
    ) -> Any:
        self.calls.append(("run_once_rated", key, fingerprint, durability, rate_class))
        self._refused("run_once_rated")
        if not rate_class:
            raise Err(types.StepError_InvalidKey("a rate class name must not be empty"))
        self._reserve(key, rate_class)
        return self.run_once(key, fingerprint, durability)

    def run_once_many(self, requests: list[Any]) -> list[Any]:
        self.calls.append(("run_once_many", [r.key for r in requests]))
        self._refused("run_once_many")
        held = sum(1 for state in self.keys.values() if state.holder is not None)
        if held + len(requests) > self.max_claims:
            raise Err(
                types.StepError_TooLarge(
                    f"{len(requests)} more claims, over the limit of {self.max_claims}"
                )
            )
        taken: list[FakeClaim] = []
        outcomes = []
        try:
            for r in requests:
                outcome = self.run_once(r.key, r.fingerprint, r.durability)
                if isinstance(outcome, once.Outcome_Claimed):
                    taken.append(outcome.value)
                outcomes.append(outcome)
        except Err:
            for claim in taken:
                claim._state().holder = None
            raise
        return outcomes

    def stamp_next_request(self, key: str, token: int) -> None:
        self._refused("stamp_next_request")
        self.tied_next = (key, token)

    def take_over(self, key: str, commit: bytes | None = None) -> None:
        """Another holder takes the claim on ``key`` (and commits ``commit``)."""
        state = self.keys[key]
        state.holder = None
        state.token += 1
        state.committed = commit

    def held(self) -> FakeClaim | None:
        for state in self.keys.values():
            if state.holder is not None:
                return state.holder
        return None

    # idem:agent/progress
    def load(self) -> progress.Checkpoint | None:
        self._refused("load")
        return self.checkpoint

    def save(self, step: int, state: bytes) -> None:
        self.calls.append(("save", step, state))
        self._refused("save")
        self.checkpoint = progress.Checkpoint(step, state)
        self.saves.append((step, state))

    # idem:agent/waits
    def sleep(self, key: str, wake: waits.Wake) -> None:
        self.calls.append(("sleep", key, wake))
        self._refused("sleep")
        if self.held() is not None:
            raise Err(waits.WaitError_ClaimsHeld("commit or release the claims first"))
        if isinstance(wake, waits.Wake_After):
            due = self.sleeps.setdefault(key, self.now_ms + wake.value)
        else:
            due = self.sleeps.setdefault(key, wake.value)
        if due > self.now_ms:
            raise self.end(f"sleeping until {due}")

    def take_token(self, step_key: str, rate_class: str) -> None:
        self.calls.append(("take_token", step_key, rate_class))
        self._refused("take_token")
        if self.held() is not None:
            raise Err(waits.WaitError_ClaimsHeld("commit or release the claims first"))
        if not rate_class:
            raise Err(waits.WaitError_InvalidKey("a rate class name must not be empty"))
        self._reserve(step_key, rate_class)

    def _reserve(self, step_key: str, rate_class: str) -> None:
        """Takes a token of `rate_class` for the step, or ends the instance until it is
        free; a step that took one before finds it again."""
        key = "rate:" + step_key
        if key not in self.tokens:
            due = self.now_ms
            if rate_class in self.rates:
                due = max(due, self.next_token.get(rate_class, 0))
                self.next_token[rate_class] = due + self.rates[rate_class]
            self.tokens[key] = due
        if self.tokens[key] > self.now_ms:
            raise self.end(f"waiting for a token of {rate_class} until {self.tokens[key]}")

    def wait_for_signal(self, key: str, name: str, timeout_ms: int | None) -> waits.Received:
        self.calls.append(("wait", key, name, timeout_ms))
        self._refused("wait")
        if key not in self.received:
            queue = self.signals.get(name, [])
            if queue:
                self.received[key] = queue.pop(0)
            elif timeout_ms is not None and timeout_ms <= 0:
                self.received[key] = None
            else:
                raise self.end(f"waiting for {name}")
        payload = self.received[key]
        if payload is None:
            return waits.Received_TimedOut()
        return waits.Received_Payload(payload)

    # idem:agent/children
    def child_id(self, key: str) -> str:
        """The run id of the child spawned under ``key`` (the host hashes; this is
        readable)."""
        return f"{self.run_id}~{key}"

    def finish(self, key: str, status: children.ChildStatus, output: bytes = b"") -> None:
        """The child spawned under ``key`` ends (the parent's join sees it)."""
        child = self.children[self.child_id(key)]
        assert child.end is None, f"child {key} ended twice"
        child.end = (status, output)
        child.ended_as = 1 + sum(1 for c in self.children.values() if c.ended_as)

    def spawn(self, key: str, deployment: str, input: bytes, detached: bool) -> str:
        self.calls.append(("spawn", key, deployment, bytes(input), detached))
        self._refused("spawn")
        return self._spawn(key, deployment, input, detached)

    def spawn_many(self, requests: list[children.SpawnRequest]) -> list[Any]:
        self.calls.append(
            (
                "spawn_many",
                [(r.key, r.deployment, bytes(r.input), r.detached) for r in requests],
            )
        )
        if self.ended is not None:
            raise InstanceEnded(self.ended)
        answers: list[Any] = []
        for r in requests:
            try:
                answers.append(Ok(self._spawn(r.key, r.deployment, r.input, r.detached)))
            except Err as err:
                answers.append(err)
        return answers

    def _spawn(self, key: str, deployment: str, input: bytes, detached: bool) -> str:
        if not key or any(ord(c) < 0x20 or ord(c) == 0x7F for c in key):
            raise Err(children.SpawnError_InvalidKey("the key is empty or holds a control"))
        if deployment not in self.deployments:
            raise Err(
                children.SpawnError_UnknownDeployment(f'no deployment is called "{deployment}"')
            )
        run_id = self.child_id(key)
        known = self.children.get(run_id)
        if known is not None:
            if (known.deployment, known.input) != (deployment, bytes(input)):
                raise Err(
                    children.SpawnError_KeyReused(
                        f'the key "{key}" was spawned with another deployment or input'
                    )
                )
            return run_id
        if len(self.children) >= self.max_children:
            raise Err(
                children.SpawnError_Limit(
                    f"this run has spawned {len(self.children)} children, the limit"
                )
            )
        self.children[run_id] = FakeChild(key, deployment, bytes(input), detached)
        return run_id

    def _join(self, key: str, ids: list[str], timeout_ms: int | None, mode: str) -> Any:
        self.calls.append((f"join_{mode}", key, list(ids), timeout_ms))
        self._refused("join")
        if not key:
            raise Err(children.JoinError_InvalidKey("the key is empty"))
        if self.held() is not None:
            raise Err(children.JoinError_ClaimsHeld("commit or release the claims first"))
        recorded = self.joins.get(key)
        if recorded is not None:
            if (recorded[0], recorded[1]) != (ids, mode):
                raise Err(children.JoinError_KeyReused(f'"{key}" joined other children'))
            return recorded[2]
        if key in self.sleeps or key in self.received:
            raise Err(children.JoinError_KeyReused(f'"{key}" is another wait\'s key'))
        if not ids or len(set(ids)) != len(ids):
            raise Err(children.JoinError_InvalidChildren("empty, or a child listed twice"))
        for run_id in ids:
            if run_id not in self.children:
                raise Err(children.JoinError_NotAChild(run_id))
        ends = [
            children.ChildEnd(i, run_id, *end)
            for i, run_id in enumerate(ids)
            if (end := self.children[run_id].end) is not None
        ]
        if mode == "any" and ends:
            first = min(ends, key=lambda e: self.children[e.run_id].ended_as)
            self.joins[key] = (ids, mode, [first])
        elif mode == "all" and len(ends) == len(ids):
            self.joins[key] = (ids, mode, ends)
        else:
            deadline = self.join_deadlines.setdefault(
                key, None if timeout_ms is None else self.now_ms + timeout_ms
            )
            if deadline is None or deadline > self.now_ms:
                raise self.end(f"joining {key}")
            self.joins[key] = (ids, mode, None)
        return self.joins[key][2]

    def join_all(self, key: str, ids: list[str], timeout_ms: int | None) -> Any:
        return self._join(key, ids, timeout_ms, "all")

    def join_any(self, key: str, ids: list[str], timeout_ms: int | None) -> Any:
        ends = self._join(key, ids, timeout_ms, "any")
        return None if ends is None else ends[0]

    # idem:agent/outbound
    def set_header_names(self, key: str, token: str) -> None:
        self._refused("set_header_names")
        if not key or not token or key == token or key.lower() in ("host", "content-length"):
            raise Err(f"bad header names {key!r}, {token!r}")
        self.header_names = (key.lower(), token.lower())

    # wasi:http/outgoing-handler
    def handle(self, req: FakeOutgoingRequest, options: FakeRequestOptions | None) -> Any:
        self._refused("handle")
        tied, self.tied_next = self.tied_next, None
        claim = self.held()
        if tied is not None:
            state = self.keys.get(tied[0])
            claim = state.holder if state is not None else None
            if claim is None or claim._token != tied[1]:
                raise Err(http_types.ErrorCode_HttpRequestDenied())
        if claim is None and not self.http_outside_claims:
            self.denial = (
                f"HTTP request to {req.authority} denied: it was made outside any run-once "
                "claim, and the run's policy keeps side effects inside claims"
            )
            raise Err(http_types.ErrorCode_HttpRequestDenied())
        headers = list(req.fields.items)
        if claim is not None:
            key_name, token_name = self.header_names
            headers += [(key_name, claim._key.encode()), (token_name, str(claim._token).encode())]
        request = Request(
            req.method,
            req.scheme,
            req.authority,
            req.path,
            headers,
            dict(options.values) if options else {},
        )
        self.requests.append(request)
        self.events.append(("handle", claim._key if claim is not None else None))
        req.out.request = request
        return FakeFuture(self, request)

    @contextmanager
    def installed(self) -> Iterator[FakeHost]:
        """Puts this host behind the bindings while the block runs."""
        patches = [
            (once, "run_once", lambda key, fp: self.run_once(key, fp)),
            (once, "run_once_with", self.run_once),
            (once, "run_once_many", self.run_once_many),
            (once, "run_once_rated", self.run_once_rated),
            (outbound, "stamp_next_request", self.stamp_next_request),
            (poll, "poll", fake_poll),
            (once, "Claim", FakeClaim),
            (progress, "load", self.load),
            (progress, "save", self.save),
            (run_info, "run_id", lambda: self.run_id),
            (run_info, "generation", lambda: self.generation),
            (waits, "sleep", self.sleep),
            (waits, "take_token", self.take_token),
            (waits, "wait_for_signal", self.wait_for_signal),
            (children, "spawn", self.spawn),
            (children, "join_all", self.join_all),
            (children, "join_any", self.join_any),
            (children, "spawn_many", self.spawn_many),
            (usage, "record_usage", self.record_usage),
            (live, "publish", self.publish),
            (outbound, "set_header_names", self.set_header_names),
            (outbound, "last_denial", lambda: self.denial),
            (outgoing_handler, "handle", self.handle),
            (http_types, "Fields", FakeFields),
            (http_types, "OutgoingRequest", FakeOutgoingRequest),
            (http_types, "OutgoingBody", FakeOutgoingBody),
            (http_types, "RequestOptions", FakeRequestOptions),
            (http_types, "IncomingBody", FakeIncomingBody),
        ]
        with ExitStack() as stack:
            for module, name, value in patches:
                stack.enter_context(mock.patch.object(module, name, value))
            yield self


class FakeClaim(once.Claim):
    def __init__(self, host: FakeHost, key: str, attempt: int, token: int, in_doubt: bool):
        self._host, self._key, self._attempt = host, key, attempt
        self._token, self._in_doubt = token, in_doubt

    def key(self) -> str:
        return self._key

    def attempt(self) -> int:
        return self._attempt

    def in_doubt(self) -> bool:
        return self._in_doubt

    def token(self) -> int:
        return self._token

    def _state(self) -> KeyState:
        return self._host.keys[self._key]

    @classmethod
    def commit(cls, this: Any, value: bytes, then_save: progress.Checkpoint | None) -> None:
        host = this._host
        host.calls.append(("commit", this._key, value, then_save))
        if host.before_commit is not None:
            host.before_commit(this._key)
        host._refused("commit")
        state = this._state()
        if state.holder is not this:
            raise Err(types.StepError_ClaimLost(f"{this._key} was taken over"))
        state.holder = None
        state.committed = bytes(value)
        state.in_doubt = False
        if then_save is not None:
            host.checkpoint = then_save
            host.saves.append((then_save.step, then_save.state))

    @classmethod
    def release(cls, this: Any) -> None:
        this._host.calls.append(("release", this._key))
        this._host._refused("release")
        state = this._state()
        if state.holder is this:
            state.holder = None
            state.in_doubt = False

    @classmethod
    def stop(cls, this: Any, reason: str) -> None:
        this._host.calls.append(("stop", this._key, reason))
        this._host._refused("stop")
        this._state().parked = reason
        raise this._host.end(f"stopped in doubt: {reason}")


# wasi:http, as much of it as the SDK's client uses.
class FakeFields:
    def __init__(self, items: list[tuple[str, bytes]]) -> None:
        self.items = items

    @classmethod
    def from_list(cls, entries: list[tuple[str, bytes]]) -> FakeFields:
        for name, _ in entries:
            if not name or any(c in name for c in " :\r\n") or name != name.lower():
                raise Err(http_types.HeaderError_InvalidSyntax())
        return cls(list(entries))

    def entries(self) -> list[tuple[str, bytes]]:
        return list(self.items)

    def __enter__(self) -> FakeFields:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class FakeOutgoingRequest:
    def __init__(self, fields: FakeFields) -> None:
        self.fields = fields
        self.method: Any = http_types.Method_Get()
        self.scheme: Any = None
        self.authority: str | None = None
        self.path: str | None = None
        self.out = FakeOutgoingBody()

    def set_method(self, method: Any) -> None:
        if isinstance(method, http_types.Method_Other) and not method.value.isalpha():
            raise Err(None)
        self.method = method

    def set_scheme(self, scheme: Any) -> None:
        self.scheme = scheme

    def set_authority(self, authority: str) -> None:
        if " " in authority:
            raise Err(None)
        self.authority = authority

    def set_path_with_query(self, path: str) -> None:
        self.path = path

    def body(self) -> FakeOutgoingBody:
        return self.out


class FakeOutgoingBody:
    def __init__(self) -> None:
        self.request: Request | None = None
        self.finished = False

    def write(self) -> FakeOutputStream:
        return FakeOutputStream(self)

    @classmethod
    def finish(cls, this: FakeOutgoingBody, trailers: Any) -> None:
        this.finished = True


class FakeOutputStream:
    def __init__(self, body: FakeOutgoingBody) -> None:
        self.body = body

    def blocking_write_and_flush(self, data: bytes) -> None:
        # wasi:io allows at most 4096 bytes per blocking write.
        if len(data) > 4096:
            raise Err(streams.StreamError_Closed())
        if self.body.request is None:
            raise Err(streams.StreamError_Closed())
        self.body.request.body += data
        self.body.request.writes.append(len(data))

    def __enter__(self) -> FakeOutputStream:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class FakeRequestOptions:
    #: Timeouts this fake host does not offer (its setters fail).
    unsupported: tuple[str, ...] = ("between_bytes",)

    def __init__(self) -> None:
        self.values: dict[str, int] = {}

    def _set(self, name: str, nanos: int) -> None:
        if name in self.unsupported:
            raise Err(None)
        self.values[name] = nanos

    def set_connect_timeout(self, nanos: int) -> None:
        self._set("connect", nanos)

    def set_first_byte_timeout(self, nanos: int) -> None:
        self._set("first_byte", nanos)

    def set_between_bytes_timeout(self, nanos: int) -> None:
        self._set("between_bytes", nanos)


class FakeFuture:
    """Not ready at the first ``get``, so the client must wait on its pollable."""

    def __init__(self, host: FakeHost, request: Request) -> None:
        self.host, self.request = host, request
        self.ready = False
        self.taken = False

    def subscribe(self) -> FakePollable:
        return FakePollable(self)

    def get(self) -> Any:
        if not self.ready:
            return None
        if self.taken:
            return Err(None)
        self.taken = True
        self.host.events.append(("response", self.request.header(self.host.header_names[0])))
        reply = self.host.server(self.request)
        if not isinstance(reply, tuple):
            return Ok(Err(reply))
        status, headers, body = reply
        return Ok(Ok(FakeIncomingResponse(status, headers, body)))

    def __enter__(self) -> FakeFuture:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class FakePollable:
    def __init__(self, future: FakeFuture) -> None:
        self.future = future

    def block(self) -> None:
        self.future.ready = True

    def __enter__(self) -> FakePollable:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def fake_poll(pollables: list[FakePollable]) -> list[int]:
    """Every future polled becomes ready at once, as if they all were in flight."""
    if not pollables:
        raise AssertionError("poll of no pollables traps")
    for p in pollables:
        p.future.ready = True
    return list(range(len(pollables)))


class FakeIncomingResponse:
    def __init__(self, status: int, headers: list[tuple[str, bytes]], body: bytes) -> None:
        self._status, self._headers, self._body = status, headers, body

    def status(self) -> int:
        return self._status

    def headers(self) -> FakeFields:
        return FakeFields(self._headers)

    def consume(self) -> FakeIncomingBody:
        return FakeIncomingBody(self._body)

    def __enter__(self) -> FakeIncomingResponse:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class FakeIncomingBody:
    #: The most a read hands back, whatever was asked: readers must loop.
    chunk = 5

    def __init__(self, body: bytes) -> None:
        self.left = body
        self.finished = False

    def stream(self) -> FakeInputStream:
        return FakeInputStream(self)

    @classmethod
    def finish(cls, this: FakeIncomingBody) -> FakeFields:
        this.finished = True
        return FakeFields([])


class FakeInputStream:
    def __init__(self, body: FakeIncomingBody) -> None:
        self.body = body

    def blocking_read(self, n: int) -> bytes:
        if not self.body.left:
            raise Err(streams.StreamError_Closed())
        take = min(n, FakeIncomingBody.chunk)
        data, self.body.left = self.body.left[:take], self.body.left[take:]
        return data

    def __enter__(self) -> FakeInputStream:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class HostTestCase(unittest.TestCase):
    """A test with a fresh :class:`FakeHost` installed as ``self.host``."""

    def setUp(self) -> None:
        self.host = FakeHost()
        stack = ExitStack()
        stack.enter_context(self.host.installed())
        self.addCleanup(stack.close)

    def _callTestMethod(self, method: Callable[[], object]) -> None:
        # `Err`, a frozen dataclass, crashes unittest's report, which sets the
        # `__traceback__` of every exception in a chain. One escaping the SDK is a bug
        # of the SDK; one chained to the SDK's exception (raised while handling it) is
        # dropped from the chain.
        try:
            method()
        except Err as err:
            message = f"a raw binding error escaped the SDK: Err({err.value!r})"
        except BaseException as exc:
            link: BaseException | None = exc
            while link is not None:
                if isinstance(link.__cause__, Err):
                    link.__cause__ = None
                if isinstance(link.__context__, Err):
                    link.__context__ = None
                link = link.__cause__ or link.__context__
            raise
        else:
            return
        raise AssertionError(message)

    def committed(self, key: str) -> bytes | None:
        return self.host.keys[key].committed
