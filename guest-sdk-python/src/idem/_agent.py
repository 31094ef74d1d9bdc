"""The export wrapper: an agent function becomes the component's ``run`` export."""

from __future__ import annotations

import inspect
import sys
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

from . import _json
from ._host import Err

F = TypeVar("F", bound=Callable[[Any], Any])


def _describe(exc: BaseException) -> str:
    # The run's error: the exception's own line first (what `idem status` shows),
    # then the traceback that says where it came from.
    head = f"{type(exc).__name__}: {exc}"
    trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return f"{head}\n\n{trace.rstrip()}"


def _input_type(fn: Callable[..., Any]) -> Any:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if not params:
        return None
    hint = params[0].annotation
    if isinstance(hint, str):
        # `from __future__ import annotations` leaves the annotation a name.
        hint = getattr(fn, "__globals__", {}).get(hint)
    return None if hint is inspect.Parameter.empty else hint


def agent(fn: F) -> F:
    """Makes ``fn`` the agent: ``fn(input)`` gets the run's input decoded from JSON (a
    dataclass when its parameter is annotated with one) and returns the output (JSON
    or a dataclass). Any exception it lets escape fails the run with the exception's
    text and traceback; the instance never traps for it.

    Use it once, on a function at the top level of the app module.
    """
    in_type = _input_type(fn)

    class WitWorld:
        def run(self, input: bytes) -> bytes:
            try:
                value = _json.build(in_type, _json.loads(input, "input"), "input")
                return _json.dumps(fn(value), "output")
            except BaseException as exc:
                # Every failure is the run's error, never a trap.
                raise Err(_describe(exc)) from None

    # componentize-py calls the export on the app module's `WitWorld`, an attribute
    # the module does not declare (so set by name, as the type checker wants).
    setattr(sys.modules[fn.__module__], "WitWorld", WitWorld)  # noqa: B010
    return fn
