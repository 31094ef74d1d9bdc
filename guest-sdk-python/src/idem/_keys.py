"""Idempotency keys, derived exactly as the Rust SDK derives them (``wit/keys.md``)."""

from __future__ import annotations

import hashlib
from typing import Any

from . import _json


def content_hash(content: Any) -> str:
    """The first 16 bytes of the SHA-256 of ``content``'s JSON, in lower hex."""
    return hashlib.sha256(_json.dumps(content, "key content")).hexdigest()[:32]


class Key:
    """The idempotency key of one side effect.

    Name an effect by *what* it does, never by when or how often it was tried: a
    resumed run recomputes the same key and finds the committed result.

    >>> Key.shared("charge", "order-17").text
    'charge/dce02a7b0ea5eefdb57dbe5cae1a5dec'
    """

    __slots__ = ("fingerprint", "text")

    def __init__(self, text: str, fingerprint: str | None = None) -> None:
        if not isinstance(text, str):
            raise TypeError(f"a key is a str, got {type(text).__name__}")
        self.text = text
        self.fingerprint = fingerprint

    @classmethod
    def shared(cls, step: str, content: Any) -> Key:
        """A key shared by every run: ``{step}/{hash}``."""
        return cls(f"{step}/{content_hash(content)}")

    @classmethod
    def for_run(cls, step: str, content: Any) -> Key:
        """A key private to this run: ``{run_id}/{step}/{hash}``."""
        from ._host import run_id

        return cls(f"{run_id()}/{step}/{content_hash(content)}")

    def with_input(self, input: Any) -> Key:
        """Binds the key to ``input``: reusing it with other input fails with ``KeyReused``."""
        return Key(self.text, f"sha256:{content_hash(input)}")

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"Key({self.text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Key) and (self.text, self.fingerprint) == (
            other.text,
            other.fingerprint,
        )

    def __hash__(self) -> int:
        return hash((self.text, self.fingerprint))


def as_key(key: Key | str) -> Key:
    """``key`` as a :class:`Key`: a ``str`` is taken as the key's text."""
    return key if isinstance(key, Key) else Key(key)
