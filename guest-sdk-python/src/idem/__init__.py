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

from ._agent import agent
from ._errors import (
    AwaitTimeout,
    ClaimLost,
    ClaimSettled,
    ClaimsHeld,
    CodecError,
    HttpDenied,
    HttpError,
    IdemError,
    InDoubt,
    InvalidKey,
    InvalidTime,
    InvalidWaitKey,
    KeyReused,
    StepError,
    TimedOut,
    TooLarge,
    WaitError,
    WaitKeyReused,
)
from ._keys import Key
from ._once import FAIL, RETRY, Checkpoint, Once, Outcome, Step, load, once, run_once, save
from ._host import generation, run_id
from ._waits import sleep, sleep_until, wait_for_signal
from . import http

__all__ = [
    "agent", "Key", "run_once", "once", "Once", "Outcome", "Step", "RETRY", "FAIL",
    "Checkpoint", "load", "save", "run_id", "generation", "http", "IdemError",
    "StepError", "InvalidKey", "TooLarge", "ClaimLost", "AwaitTimeout", "InDoubt",
    "KeyReused", "CodecError", "ClaimSettled", "HttpError", "HttpDenied",
    "sleep", "sleep_until", "wait_for_signal", "WaitError", "InvalidWaitKey",
    "InvalidTime", "WaitKeyReused", "ClaimsHeld", "TimedOut",
]
