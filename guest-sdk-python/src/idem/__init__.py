"""idem for Python: side effects exactly once in agents that run as WebAssembly
components under idem, built with ``componentize-py``.

>>> import idem
>>> @idem.agent
... def run(input):
...     for item in input["items"]:
...         idem.run_once(idem.Key.for_run("send", item), lambda step: f"sent {item}")
...     return {"sent": len(input["items"])}

The host may drop the instance at any host call and call ``run`` again, with the same
input, on a fresh instance: keep progress in keys and the checkpoint, never in memory.
Import everything at module top level: the import runs once, when the component is
built, not on every instance.
"""

from . import http, llm
from ._agent import agent
from ._agent import watch_importer as _watch_importer
from ._children import (
    Child,
    ChildOutcome,
    ChildSpec,
    join,
    join_all,
    join_any,
    spawn,
    spawn_all,
    spawn_many,
)
from ._errors import (
    AwaitTimeout,
    ChildFailed,
    ClaimLost,
    ClaimSettled,
    ClaimsHeld,
    CodecError,
    EffectFailed,
    HttpDenied,
    HttpError,
    IdemError,
    InDoubt,
    InvalidChildren,
    InvalidJoinKey,
    InvalidJoinTime,
    InvalidKey,
    InvalidLiveKey,
    InvalidSpawnKey,
    InvalidTime,
    InvalidWaitKey,
    JoinClaimsHeld,
    JoinError,
    JoinKeyReused,
    JoinTimedOut,
    KeyReused,
    LiveError,
    LiveTooLarge,
    NotAChild,
    SpawnCycle,
    SpawnError,
    SpawnKeyReused,
    SpawnLimit,
    SpawnTooLarge,
    StepError,
    TimedOut,
    TooLarge,
    UnknownDeployment,
    WaitError,
    WaitKeyReused,
)
from ._host import generation, run_id
from ._keys import Key
from ._live import MAX_CHUNK_BYTES, publish
from ._once import FAIL, RETRY, Checkpoint, Once, Outcome, Step, load, once, run_once, save
from ._once_all import run_once_all
from ._retry import Permanent, RetryPolicy, Transient, run_once_retry
from ._waits import sleep, sleep_until, take_token, wait_for_signal

__all__ = [
    "FAIL",
    "MAX_CHUNK_BYTES",
    "RETRY",
    "AwaitTimeout",
    "Checkpoint",
    "Child",
    "ChildFailed",
    "ChildOutcome",
    "ChildSpec",
    "ClaimLost",
    "ClaimSettled",
    "ClaimsHeld",
    "CodecError",
    "EffectFailed",
    "HttpDenied",
    "HttpError",
    "IdemError",
    "InDoubt",
    "InvalidChildren",
    "InvalidJoinKey",
    "InvalidJoinTime",
    "InvalidKey",
    "InvalidLiveKey",
    "InvalidSpawnKey",
    "InvalidTime",
    "InvalidWaitKey",
    "JoinClaimsHeld",
    "JoinError",
    "JoinKeyReused",
    "JoinTimedOut",
    "Key",
    "KeyReused",
    "LiveError",
    "LiveTooLarge",
    "NotAChild",
    "Once",
    "Outcome",
    "Permanent",
    "RetryPolicy",
    "SpawnCycle",
    "SpawnError",
    "SpawnKeyReused",
    "SpawnLimit",
    "SpawnTooLarge",
    "Step",
    "StepError",
    "TimedOut",
    "TooLarge",
    "Transient",
    "UnknownDeployment",
    "WaitError",
    "WaitKeyReused",
    "agent",
    "generation",
    "http",
    "join",
    "join_all",
    "join_any",
    "llm",
    "load",
    "once",
    "publish",
    "run_id",
    "run_once",
    "run_once_all",
    "run_once_retry",
    "save",
    "sleep",
    "sleep_until",
    "spawn",
    "spawn_all",
    "spawn_many",
    "take_token",
    "wait_for_signal",
]

# A build of the app that imports idem without `@idem.agent` fails naming the mistake.
_watch_importer()
