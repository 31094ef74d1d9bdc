"""The raw bindings, reached in one place; the rest of the SDK never imports them."""

from __future__ import annotations

from typing import NoReturn

from componentize_py_types import Err
from wit_world.imports import idem_agent_types as types
from wit_world.imports import once, outbound, progress, run_info, waits  # noqa: F401

from . import _errors


def run_id() -> str:
    """The run's id: stable across instances and host restarts."""
    return run_info.run_id()


def generation() -> int:
    """How many instances were created for this run before this one (0 for the first)."""
    return run_info.generation()


_STEP_ERRORS = {
    types.StepError_InvalidKey: _errors.InvalidKey,
    types.StepError_TooLarge: _errors.TooLarge,
    types.StepError_ClaimLost: _errors.ClaimLost,
    types.StepError_AwaitTimeout: _errors.AwaitTimeout,
    types.StepError_InDoubt: _errors.InDoubt,
    types.StepError_KeyReused: _errors.KeyReused,
}


def _raise(err: Err, classes: dict, default: type) -> NoReturn:
    # A WIT error variant's case names the exception; its payload is the detail.
    value = err.value
    cls = classes.get(type(value), default)
    raise cls(str(getattr(value, "value", value))) from None


def raise_step_error(err: Err) -> NoReturn:
    """Turns a WIT ``step-error`` into the SDK's exception for it."""
    _raise(err, _STEP_ERRORS, _errors.StepError)


_WAIT_ERRORS = {
    waits.WaitError_InvalidKey: _errors.InvalidWaitKey,
    waits.WaitError_InvalidTime: _errors.InvalidTime,
    waits.WaitError_KeyReused: _errors.WaitKeyReused,
    waits.WaitError_ClaimsHeld: _errors.ClaimsHeld,
}


def raise_wait_error(err: Err) -> NoReturn:
    """Turns a WIT ``wait-error`` into the SDK's exception for it."""
    _raise(err, _WAIT_ERRORS, _errors.WaitError)
