"""The JSON conventions of the contract (``wit/keys.md``): how values become bytes."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from ._errors import CodecError


def _plain(value: Any) -> Any:
    # A value that names its own encoding (a `Child` is its run id).
    own = getattr(value, "_json_value", None)
    if own is not None and not isinstance(value, type):
        return own()
    # Dataclasses become objects in field order, as serde encodes a Rust struct.
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def dumps(value: Any, what: str) -> bytes:
    """Encodes ``value`` as the contract's JSON: compact, UTF-8, no NaN.

    Raises :class:`CodecError` naming ``what`` when it cannot be encoded.
    """
    try:
        text = json.dumps(_plain(value), separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise CodecError(f"{what}: {err}") from err
    return text.encode("utf-8")


def loads(data: bytes, what: str) -> Any:
    """Decodes the contract's JSON; raises :class:`CodecError` naming ``what``."""
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise CodecError(f"{what}: {err}") from err


def build(cls: Any, value: Any, what: str) -> Any:
    """Makes ``value`` (decoded JSON) a ``cls`` when ``cls`` is a dataclass."""
    if cls is None or not (dataclasses.is_dataclass(cls) and isinstance(cls, type)):
        return value
    if not isinstance(value, dict):
        raise CodecError(f"{what}: expected an object for {cls.__name__}, got {value!r}")
    try:
        return cls(**value)
    except TypeError as err:
        raise CodecError(f"{what}: {err}") from err
