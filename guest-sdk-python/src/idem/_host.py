"""The raw bindings componentize-py generates, reached in one place: the rest of the SDK
imports them from here, and turns their errors into the SDK's exceptions here."""

from __future__ import annotations

from typing import NoReturn

from componentize_py_types import Err
from wit_world.imports import (
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
from wit_world.imports import idem_agent_types as types
from wit_world.imports import wasi_http_types as http_types

from . import _errors

__all__ = [
    "Err",
    "children",
    "generation",
    "http_types",
    "live",
    "once",
    "outbound",
    "outgoing_handler",
    "poll",
    "progress",
    "raise_join_error",
    "raise_spawn_error",
    "raise_step_error",
    "raise_wait_error",
    "run_id",
    "run_info",
    "streams",
    "types",
    "usage",
    "waits",
]


def run_id() -> str:
    """The run's id: stable across instances and host restarts."""
    return run_info.run_id()


def generation() -> int:
    """How many instances were created for this run before this one (0 for the first)."""
    return run_info.generation()


_STEP_ERRORS: dict[type, type[_errors.StepError]] = {
    types.StepError_InvalidKey: _errors.InvalidKey,
    types.StepError_TooLarge: _errors.TooLarge,
    types.StepError_ClaimLost: _errors.ClaimLost,
    types.StepError_AwaitTimeout: _errors.AwaitTimeout,
    types.StepError_InDoubt: _errors.InDoubt,
    types.StepError_KeyReused: _errors.KeyReused,
}


def raise_step_error(err: Err[types.StepError]) -> NoReturn:
    """Turns a WIT ``step-error`` into the SDK's exception for it: the variant's case
    names the exception, its payload is the detail."""
    value = err.value
    raise _STEP_ERRORS.get(type(value), _errors.StepError)(value.value) from None


_WAIT_ERRORS: dict[type, type[_errors.WaitError]] = {
    waits.WaitError_InvalidKey: _errors.InvalidWaitKey,
    waits.WaitError_InvalidTime: _errors.InvalidTime,
    waits.WaitError_KeyReused: _errors.WaitKeyReused,
    waits.WaitError_ClaimsHeld: _errors.ClaimsHeld,
}


def raise_wait_error(err: Err[waits.WaitError]) -> NoReturn:
    """Turns a WIT ``wait-error`` into the SDK's exception for it."""
    value = err.value
    raise _WAIT_ERRORS.get(type(value), _errors.WaitError)(value.value) from None


_SPAWN_ERRORS: dict[type, type[_errors.SpawnError]] = {
    children.SpawnError_InvalidKey: _errors.InvalidSpawnKey,
    children.SpawnError_UnknownDeployment: _errors.UnknownDeployment,
    children.SpawnError_KeyReused: _errors.SpawnKeyReused,
    children.SpawnError_TooLarge: _errors.SpawnTooLarge,
    children.SpawnError_Limit: _errors.SpawnLimit,
    children.SpawnError_Cycle: _errors.SpawnCycle,
}


def spawn_error(value: children.SpawnError) -> _errors.SpawnError:
    """The SDK's exception for a WIT ``spawn-error``."""
    return _SPAWN_ERRORS.get(type(value), _errors.SpawnError)(value.value)


def raise_spawn_error(err: Err[children.SpawnError]) -> NoReturn:
    """Turns a WIT ``spawn-error`` into the SDK's exception for it."""
    raise spawn_error(err.value) from None


_JOIN_ERRORS: dict[type, type[_errors.JoinError]] = {
    children.JoinError_InvalidKey: _errors.InvalidJoinKey,
    children.JoinError_InvalidChildren: _errors.InvalidChildren,
    children.JoinError_NotAChild: _errors.NotAChild,
    children.JoinError_KeyReused: _errors.JoinKeyReused,
    children.JoinError_InvalidTime: _errors.InvalidJoinTime,
    children.JoinError_ClaimsHeld: _errors.JoinClaimsHeld,
}


def raise_join_error(err: Err[children.JoinError]) -> NoReturn:
    """Turns a WIT ``join-error`` into the SDK's exception for it."""
    value = err.value
    raise _JOIN_ERRORS.get(type(value), _errors.JoinError)(value.value) from None
