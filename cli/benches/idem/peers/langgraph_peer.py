"""LangGraph, the agent-framework reference: its functional API, an ``@entrypoint``
whose steps are ``@task`` calls, with ``SqliteSaver`` (langgraph-checkpoint-sqlite) as
the checkpointer. Each finished task's result is written to the thread's checkpoint
as it completes; a resumed invocation (``invoke(None)`` on the same thread) replays the
entrypoint and takes finished tasks' results from there. The saver sets WAL; the
connection keeps Python's default ``synchronous`` FULL (``steps`` prints both).

Every invocation asks for ``durability="sync"``: each task's result is committed before
the next task starts, as a durable step's is. LangGraph's default, ``"async"``, commits
while the next task runs, so that a kill can lose finished steps (measured here: two
steps run again after the kill inside step 620, against one with ``"sync"``).
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from typing import Any

import common
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.func import entrypoint, task


@task
def record(i: int) -> int:
    return i


@task
def logged(i: int) -> int:
    return common.effect(i)


def build(saver: SqliteSaver) -> tuple[Any, Any]:
    @entrypoint(checkpointer=saver)
    def steps(n: int) -> int:
        for i in range(n):
            record(i).result()
        return n

    @entrypoint(checkpointer=saver)
    def crash(n: int) -> int:
        for i in range(n):
            logged(i).result()
        return n

    return steps, crash


def config(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


DURABILITY = "sync"


def main() -> None:
    args = common.parse()
    common.configure(args)
    conn = sqlite3.connect(args.db, check_same_thread=False)
    saver = SqliteSaver(conn)
    saver.setup()
    steps, crash = build(saver)

    def mode() -> dict[str, object]:
        return {
            "journal_mode": conn.execute("PRAGMA journal_mode").fetchone()[0],
            "synchronous": conn.execute("PRAGMA synchronous").fetchone()[0],
        }

    if args.workload == "steps":
        # Untimed: the first workflow pays for what is set up once.
        steps.invoke(10, config(str(uuid.uuid4())), durability=DURABILITY)
        samples = []
        for _ in range(args.turns):
            t = time.perf_counter()
            steps.invoke(args.n, config(str(uuid.uuid4())), durability=DURABILITY)
            samples.append((time.perf_counter() - t) * 1e6 / args.n)
        common.report(per_step_us=samples, mode=mode())
    elif args.workload == "short":
        # Untimed: the first workflow pays for what is set up once.
        steps.invoke(10, config(str(uuid.uuid4())), durability=DURABILITY)
        samples = []
        for _ in range(args.turns):
            t = time.perf_counter()
            for _ in range(args.n):
                steps.invoke(1, config(str(uuid.uuid4())), durability=DURABILITY)
            samples.append(args.n / (time.perf_counter() - t))
        common.report(per_second=samples, mode=mode())
    elif args.workload == "crash":
        crash.invoke(args.n, config(args.id), durability=DURABILITY)
    elif args.workload == "resume":
        done = crash.invoke(None, config(args.id), durability=DURABILITY)
        common.report(done=done)


if __name__ == "__main__":
    main()
