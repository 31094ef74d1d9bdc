"""A small synchronous HTTP client on ``wasi:http``.

The host lets a request through only to destinations the operator granted
(``--allow-http HOST[:PORT]``) and, unless told otherwise, only from inside a
``run_once`` side effect, where it stamps the request with the step's idempotency key
and fencing token (``Idempotency-Key`` and ``Idempotency-Token``; see
:func:`set_header_names`) so that the receiver can dedupe a retried effect.

>>> import idem
>>> def charge(step):
...     r = idem.http.post("https://payments.example.com/charges", json={"order": 17})
...     if not r.ok:
...         raise RuntimeError(f"charge refused: {r.status}")
...     return r.json()
"""

from __future__ import annotations

import contextlib
import json as _jsonlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ._errors import HttpDenied, HttpError
from ._host import Err, outbound, outgoing_handler, poll, streams
from ._host import http_types as t
from ._once import Step

__all__ = [
    "Request",
    "Response",
    "delete",
    "get",
    "post",
    "put",
    "request",
    "send_all",
    "set_header_names",
]

_WRITE_CHUNK = 4096
_READ_CHUNK = 64 * 1024


def set_header_names(key: str, token: str) -> None:
    """Renames the key and token headers for this instance's later requests."""
    try:
        outbound.set_header_names(key, token)
    except Err as err:
        raise HttpError(f"header names refused: {err.value}") from None


@dataclass
class Response:
    """A response read to its end. Header names are lower-case."""

    status: int
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    body: bytes = b""

    @property
    def ok(self) -> bool:
        """Whether the status is 2xx."""
        return 200 <= self.status < 300

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (any case), if present and UTF-8."""
        for k, v in self.headers:
            if k.lower() == name.lower():
                try:
                    return v.decode("utf-8")
                except UnicodeDecodeError:
                    return None
        return None

    @property
    def text(self) -> str:
        """The body as UTF-8, any invalid byte replaced."""
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The body decoded from JSON."""
        return _jsonlib.loads(self.body)


_METHODS: dict[str, t.Method] = {
    "GET": t.Method_Get(),
    "HEAD": t.Method_Head(),
    "POST": t.Method_Post(),
    "PUT": t.Method_Put(),
    "DELETE": t.Method_Delete(),
    "CONNECT": t.Method_Connect(),
    "OPTIONS": t.Method_Options(),
    "TRACE": t.Method_Trace(),
    "PATCH": t.Method_Patch(),
}


@dataclass
class _Url:
    full: str
    scheme: t.Scheme
    https: bool
    authority: str
    path_with_query: str

    @classmethod
    def parse(cls, full: str) -> _Url:
        def bad(why: str) -> HttpError:
            return HttpError(f"bad URL {full!r}: {why}")

        scheme, sep, rest = full.partition("://")
        if not sep or scheme.lower() not in ("http", "https"):
            raise bad("expected http:// or https://")
        # The fragment is for the client alone: it is never sent.
        rest = rest.split("#", 1)[0]
        cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
        authority, path = rest[:cut], rest[cut:]
        if not authority:
            raise bad("no host")
        https = scheme.lower() == "https"
        return cls(
            full, t.Scheme_Https() if https else t.Scheme_Http(), https, authority, path or "/"
        )

    def destination(self) -> str:
        _, sep, port = self.authority.rpartition(":")
        if sep and "]" not in port:
            return self.authority
        return f"{self.authority}:{443 if self.https else 80}"


def _error(url: _Url, code: t.ErrorCode) -> HttpError:
    if isinstance(code, t.ErrorCode_HttpRequestDenied):
        # The host names the one cause: not granted, outside any claim, or no plain host.
        why = outbound.last_denial()
        return HttpDenied(why or f"HTTP request to {url.destination()} denied by the host")
    return HttpError(f"HTTP request to {url.full} failed: {code}")


def request(
    method: str,
    url: str,
    *,
    headers: Mapping[str, str] | Iterable[tuple[str, str]] | None = None,
    body: bytes | str | None = None,
    json: Any = None,
    timeout: float | None = None,
    under: Step | None = None,
    on_body: Callable[[int, bytes], None] | None = None,
) -> Response:
    """Sends a request and reads the whole response; ``on_body(status, piece)``, if
    given, gets each piece of the body as it arrives (a server-sent event stream is read
    as it comes, not when it ends), and the response still holds the whole body.

    Raises :class:`~idem.HttpDenied` when the host refuses it and
    :class:`~idem.HttpError` when the URL is unusable or the exchange fails; a
    response with any status (4xx, 5xx too) is a :class:`Response`. ``timeout``
    (seconds) bounds the connection, the first byte and the gaps between bytes.
    ``under`` ties the request to a step of :func:`~idem.run_once_all`: it carries that
    step's key and token, and is refused once that claim is settled or taken over.
    """
    started = _start(Request(method, url, headers, body, json, timeout, under))
    while started.future.get_ready() is None:
        with started.future.subscribe() as pollable:
            pollable.block()
    return started.finish(on_body)


@dataclass
class Request:
    """A request for :func:`send_all`; the arguments of :func:`request`."""

    method: str
    url: str
    headers: Mapping[str, str] | Iterable[tuple[str, str]] | None = None
    body: bytes | str | None = None
    json: Any = None
    timeout: float | None = None
    #: The step of :func:`~idem.run_once_all` the request is made for.
    under: Step | None = None


def send_all(requests: Iterable[Request]) -> list[Response | HttpError]:
    """Sends every request at once and returns each one's :class:`Response`, or the
    :class:`~idem.HttpError` it failed with, in their order: the requests are in flight
    together, so the whole takes about as long as the slowest, not the sum.

    >>> import idem
    >>> def tools(steps):
    ...     return idem.http.send_all(
    ...         idem.http.Request("POST", f"http://127.0.0.1:8080/{s.key}", under=s)
    ...         for s in steps
    ...     )
    """
    started: list[_Started | HttpError] = []
    for r in requests:
        try:
            started.append(_start(r))
        except HttpError as err:
            started.append(err)
    while True:
        waiting = [s for s in started if isinstance(s, _Started) and s.future.get_ready() is None]
        if not waiting:
            break
        with contextlib.ExitStack() as stack:
            poll.poll([stack.enter_context(s.future.subscribe()) for s in waiting])
    out: list[Response | HttpError] = []
    for s in started:
        if isinstance(s, HttpError):
            out.append(s)
            continue
        try:
            out.append(s.finish())
        except HttpError as err:
            out.append(err)
    return out


class _Future:
    """A response on its way; ``get`` may be asked only once it is ready."""

    def __init__(self, inner: t.FutureIncomingResponse) -> None:
        self.inner = inner
        self.got: Any = None

    def get_ready(self) -> Any:
        if self.got is None:
            self.got = self.inner.get()
        return self.got

    def subscribe(self) -> Any:
        return self.inner.subscribe()


@dataclass
class _Started:
    """A request sent (its body too), its response not yet read."""

    url: _Url
    future: _Future
    write_error: HttpError | None

    def finish(self, on_body: Callable[[int, bytes], None] | None = None) -> Response:
        got = self.future.get_ready()
        with self.future.inner:
            pass
        if isinstance(got, Err):
            raise HttpError(f"the response of {self.url.full} was already taken")
        inner = got.value
        if isinstance(inner, Err):
            raise _error(self.url, inner.value)
        if self.write_error is not None:
            raise self.write_error
        return _read(inner.value, self.url, on_body)


def _start(r: Request) -> _Started:
    """Builds and sends ``r`` and its body, without waiting for the response."""
    url, method, body = r.url, r.method, r.body
    u = _Url.parse(url)
    headers = r.headers
    pairs = list(headers.items() if isinstance(headers, Mapping) else headers or [])
    if r.json is not None:
        body = _jsonlib.dumps(r.json, separators=(",", ":"), ensure_ascii=False)
        if not any(k.lower() == "content-type" for k, _ in pairs):
            pairs.append(("content-type", "application/json"))
    data = body.encode("utf-8") if isinstance(body, str) else (body or b"")
    method = method.upper()
    # Always say how long the body is: without it a receiver may read none of it.
    if data or method in ("POST", "PUT", "PATCH"):
        pairs = [(k, v) for k, v in pairs if k.lower() != "content-length"]
        pairs.append(("content-length", str(len(data))))
    try:
        fields = t.Fields.from_list([(k.lower(), str(v).encode("utf-8")) for k, v in pairs])
    except Err as err:
        raise HttpError(f"headers of {url} cannot be sent: {err.value}") from None
    req = t.OutgoingRequest(fields)
    _set("method", url, lambda: req.set_method(_METHODS.get(method) or t.Method_Other(method)))
    _set("scheme", url, lambda: req.set_scheme(u.scheme))
    _set("authority", url, lambda: req.set_authority(u.authority))
    _set("path", url, lambda: req.set_path_with_query(u.path_with_query))
    out_body = req.body()
    options = None
    if r.timeout is not None:
        options = t.RequestOptions()
        nanos = max(0, int(r.timeout * 1e9))
        for setter in (
            options.set_connect_timeout,
            options.set_first_byte_timeout,
            options.set_between_bytes_timeout,
        ):
            # A host without this timeout keeps its own.
            with contextlib.suppress(Err):
                setter(nanos)
    if r.under is not None:
        outbound.stamp_next_request(r.under.key, r.under.token)
    try:
        future = outgoing_handler.handle(req, options)
    except Err as err:
        raise _error(u, err.value) from None
    # The body goes out after `handle`: the host streams it, and a refused request
    # closes it, which the response then explains.
    write_error = None
    try:
        with out_body.write() as stream:
            for i in range(0, len(data), _WRITE_CHUNK):
                stream.blocking_write_and_flush(data[i : i + _WRITE_CHUNK])
        t.OutgoingBody.finish(out_body, None)
    except Err as err:
        write_error = HttpError(f"sending the body of {url} failed: {err.value}")
    return _Started(u, _Future(future), write_error)


def _set(what: str, url: str, setter: Callable[[], None]) -> None:
    try:
        setter()
    except Err:
        raise HttpError(f"{what} of {url} refused") from None


def _read(
    resp: t.IncomingResponse, u: _Url, on_body: Callable[[int, bytes], None] | None = None
) -> Response:
    with resp:
        status = resp.status()
        with resp.headers() as h:
            headers = [(k.lower(), v) for k, v in h.entries()]
        incoming = resp.consume()
    chunks = []
    with incoming.stream() as stream:
        while True:
            try:
                piece = stream.blocking_read(_READ_CHUNK)
                if on_body is not None:
                    on_body(status, piece)
                chunks.append(piece)
            except Err as err:
                if isinstance(err.value, streams.StreamError_Closed):
                    break
                raise HttpError(f"reading the response of {u.full} failed: {err.value}") from None
    # Trailers are not offered; finishing releases the body's resources.
    with t.IncomingBody.finish(incoming):
        pass
    return Response(status, headers, b"".join(chunks))


def get(url: str, **kw: Any) -> Response:
    """:func:`request` with method GET."""
    return request("GET", url, **kw)


def post(url: str, **kw: Any) -> Response:
    """:func:`request` with method POST."""
    return request("POST", url, **kw)


def put(url: str, **kw: Any) -> Response:
    """:func:`request` with method PUT."""
    return request("PUT", url, **kw)


def delete(url: str, **kw: Any) -> Response:
    """:func:`request` with method DELETE."""
    return request("DELETE", url, **kw)
