"""The run's live stream: text a step publishes while it runs (a model's tokens as they
arrive, progress), shown by ``idem logs -f``, ``GET /api/runs/{id}/stream`` and the web
page as it comes. The Rust SDK's ``idem_sdk::publish``."""

from __future__ import annotations

from ._errors import InvalidLiveKey, LiveTooLarge
from ._host import Err
from ._host import live as wit_live

__all__ = ["MAX_CHUNK_BYTES", "publish"]

#: The largest text one :func:`publish` may carry, in bytes (the host's bound).
MAX_CHUNK_BYTES = 16 << 10


def publish(key: str, text: str) -> None:
    """Publishes ``text`` as the next chunk of step ``key`` (usually the key of the step
    that is running: readers show each step's text apart). The host gathers chunks and
    writes them a few times a second; it never waits for a reader.

    Not durable: text published just before the instance dies may never be seen, and
    the host keeps only a run's newest text. The step's committed result is the truth,
    so publish what the result will hold, not something a reader must not miss.

    Raises :class:`~idem.InvalidLiveKey` for an empty, overlong or invisible key and
    :class:`~idem.LiveTooLarge` for a text over :data:`MAX_CHUNK_BYTES`; nothing is
    published then. Empty text publishes nothing.

    >>> import idem
    >>> def summarize(step):
    ...     for part in ["Sum", "ming ", "up…"]:
    ...         idem.publish(step.key, part)
    ...     return "Summing up…"
    """
    try:
        wit_live.publish(key, text)
    except Err as err:
        value = err.value
        if isinstance(value, wit_live.LiveError_TooLarge):
            raise LiveTooLarge(value.value) from None
        raise InvalidLiveKey(value.value) from None
