"""The export wrapper: an agent function becomes the component's ``run`` export."""

from __future__ import annotations

import inspect
import linecache
import os
import sys
import traceback
import types
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


def _missing_agent(module: types.ModuleType) -> Callable[[str], Any]:
    def __getattr__(name: str) -> Any:
        if name == "WitWorld":
            raise AttributeError(
                f"module {module.__name__!r} has no agent: decorate the function that "
                "takes the run's input with @idem.agent (`import idem`, then `@idem.agent` "
                "on the line above `def run(input):`)"
            )
        raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")

    return __getattr__


def watch(module: types.ModuleType) -> None:
    """Makes a build of ``module`` without ``@idem.agent`` fail saying so.

    componentize-py looks the export up as the app module's ``WitWorld``, which
    ``@idem.agent`` sets; without it the build died with "module 'app' has no attribute
    'WitWorld'", which names componentize-py's plumbing rather than the mistake. A module
    ``__getattr__`` (PEP 562) is asked only for names the module lacks, so it changes
    nothing for an app that has its agent, or that defines its own ``__getattr__``.
    """
    if "__getattr__" not in vars(module):
        setattr(module, "__getattr__", _missing_agent(module))  # noqa: B010


def watch_importer() -> None:
    """Watches the module whose top level is importing ``idem`` (the app, as a rule)."""
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        ours = name == "idem" or name.startswith(("idem.", "importlib"))
        if frame.f_code.co_name == "<module>" and name and not ours:
            module = sys.modules.get(name)
            if module is not None:
                watch(module)
            return
        frame = frame.f_back


def _keep_sources(app: str) -> None:
    """Reads the sources of the app's own modules and of the SDK into ``linecache`` now.

    ``@idem.agent`` runs when componentize-py builds the component, where the files are;
    the component keeps the interpreter's memory as it is then, but not the files, so a
    traceback at run time would show no source lines. An entry whose modification time
    is ``None`` is never checked against the file (``linecache.checkcache`` keeps it),
    so it outlives the build. Modules under a ``site-packages`` folder (a venv inside the
    project, say) are left out: they would make every component larger.
    """
    roots = []
    for path in (getattr(sys.modules.get(app), "__file__", None), __file__):
        if path:
            roots.append(os.path.dirname(os.path.abspath(path)) + os.sep)
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if not isinstance(path, str) or not path.endswith(".py"):
            continue
        full = os.path.abspath(path)
        ours = os.path.dirname(full) + os.sep == roots[-1]
        in_app = any(full.startswith(root) for root in roots[:-1])
        if not ours and (not in_app or "site-packages" in full.split(os.sep)):
            continue
        try:
            with open(path, encoding="utf-8") as source:
                lines = source.readlines()
        except (OSError, UnicodeDecodeError):
            continue
        linecache.cache[path] = (sum(map(len, lines)), None, lines, path)


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
    _keep_sources(fn.__module__)
    return fn
