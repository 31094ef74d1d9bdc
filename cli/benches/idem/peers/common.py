"""What the peer scripts share: the command line the bench drives them with, the side
effect whose lines the bench counts, the kill inside a step, and the one JSON line each
invocation prints.

Every script takes the same workloads:

- ``steps``: ``--turns`` workflows of ``--n`` durable steps, each step recording its
  result (the value ``i``); prints the wall time of each workflow over ``n`` in µs.
- ``short``: ``--turns`` turns of ``--n`` workflows of one step each, one after another;
  prints workflows per second for each turn.
- ``crash``: the workflow ``--id`` of ``--n`` steps, each appending the line
  ``step-{i}`` to ``--log`` and syncing it before the step records its result; inside
  step ``--kill-at`` (1-based), after its line is synced and before the step records
  it, the process SIGKILLs itself.
- ``resume``: the same workflow, resumed to completion in a fresh process.

The kill moment is a global of the process, never an input of the workflow: a resumed
workflow is replayed with its recorded inputs, and must not kill itself again.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from dataclasses import dataclass


@dataclass(frozen=True)
class Args:
    workload: str
    db: str
    n: int
    turns: int
    id: str
    log: str
    kill_at: int | None
    sync: str


def parse() -> Args:
    p = argparse.ArgumentParser()
    p.add_argument("workload", choices=["steps", "short", "crash", "resume", "reset"])
    p.add_argument("--db", required=True, help="a SQLite file or a postgresql:// URL")
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--turns", type=int, default=1)
    p.add_argument("--id", default="crash")
    p.add_argument("--log", default="")
    p.add_argument("--kill-at", type=int, default=None)
    p.add_argument("--sync", choices=["normal", "full"], default="full")
    a = p.parse_args()
    if a.workload in ("crash", "resume") and not a.log:
        p.error(f"{a.workload} needs --log")
    return Args(a.workload, a.db, a.n, a.turns, a.id, a.log, a.kill_at, a.sync)


# Set once from the command line: see the module's doc for why not a workflow input.
KILL_AT: int | None = None
LOG: str = ""


def configure(args: Args) -> None:
    global KILL_AT, LOG
    KILL_AT = args.kill_at if args.workload == "crash" else None
    LOG = args.log


def effect(i: int) -> int:
    """Step ``i``'s side effect: a line made durable, then, in the crash workload's
    step ``KILL_AT``, the kill before anything records the step."""
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"step-{i}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    if KILL_AT is not None and i + 1 == KILL_AT:
        os.kill(os.getpid(), signal.SIGKILL)
    return i


def report(**fields: object) -> None:
    print(json.dumps(fields), flush=True)
