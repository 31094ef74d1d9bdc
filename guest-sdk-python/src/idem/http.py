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
from ._host import Err, outbound, outgoing_handler, streams
from ._host import http_types as t

__all__ = ["Response", "delete", "get", "post", "put", "request", "set_header_names"]

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
) -> Response:
    """Sends a request and reads the whole response.

    Raises :class:`~idem.HttpDenied` when the host refuses it and
    :class:`~idem.HttpError` when the URL is unusable or the exchange fails; a
    response with any status (4xx, 5xx too) is a :class:`Response`. ``timeout``
    (seconds) bounds the connection, the first byte and the gaps between bytes.
    """
    u = _Url.parse(url)
    pairs = list(headers.items() if isinstance(headers, Mapping) else headers or [])
    if json is not None:
        body = _jsonlib.dumps(json, separators=(",", ":"), ensure_ascii=False)
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
    if timeout is not None:
        options = t.RequestOptions()
        nanos = max(0, int(timeout * 1e9))
        for setter in (
            options.set_connect_timeout,
            options.set_first_byte_timeout,
            options.set_between_bytes_timeout,
        ):
            # A host without this timeout keeps its own.
            with contextlib.suppress(Err):
                setter(nanos)
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
    with future:
        while True:
            got = future.get()
            if got is not None:
                break
            with future.subscribe() as pollable:
                pollable.block()
    if isinstance(got, Err):
        raise HttpError(f"the response of {url} was already taken")
    inner = got.value
    if isinstance(inner, Err):
        raise _error(u, inner.value)
    if write_error is not None:
        raise write_error
    return _read(inner.value, u)


def _set(what: str, url: str, setter: Callable[[], None]) -> None:
    try:
        setter()
    except Err:
        raise HttpError(f"{what} of {url} refused") from None


def _read(resp: t.IncomingResponse, u: _Url) -> Response:
    with resp:
        status = resp.status()
        with resp.headers() as h:
            headers = [(k.lower(), v) for k, v in h.entries()]
        incoming = resp.consume()
    chunks = []
    with incoming.stream() as stream:
        while True:
            try:
                chunks.append(stream.blocking_read(_READ_CHUNK))
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
