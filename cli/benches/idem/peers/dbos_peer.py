"""DBOS Transact for Python: a workflow of ``@DBOS.step`` functions, each step's result
recorded in DBOS's system database (a SQLite file, or PostgreSQL when ``--db`` is a
``postgresql://`` URL). DBOS's own settings stand: on SQLite no WAL (its rollback
journal) and ``synchronous`` FULL, Python's default; on PostgreSQL the server's
``synchronous_commit``; ``steps`` and ``short`` print what a connection reports. A
resumed process finds the pending workflow itself at ``DBOS.launch()``, as a restarted
application would, and waits for it through its handle.
"""

from __future__ import annotations

import sqlite3
import time
from urllib.parse import urlsplit, urlunsplit

import common
from dbos import DBOS, SetWorkflowID, WorkflowHandle


@DBOS.step()
def record(i: int) -> int:
    return i


@DBOS.workflow()
def steps(n: int) -> int:
    for i in range(n):
        record(i)
    return n


@DBOS.step()
def logged(i: int) -> int:
    return common.effect(i)


@DBOS.workflow()
def crash(n: int) -> int:
    for i in range(n):
        logged(i)
    return n


def reset(url: str) -> None:
    """Drops the PostgreSQL database DBOS will make again at launch: a fresh one each
    turn, so that no pending workflow of an earlier turn is recovered into this one."""
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    if not name.startswith("idem_bench_"):
        raise SystemExit(f"refusing to drop {name!r}: not a bench database")
    admin = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def mode(url: str) -> dict[str, object]:
    if not url.startswith("sqlite:///"):
        import psycopg

        with psycopg.connect(url) as pg:
            row = pg.execute("SHOW synchronous_commit").fetchone()
        return {"synchronous_commit": row[0] if row else None}
    lite = sqlite3.connect(url.removeprefix("sqlite:///"))
    try:
        return {
            "journal_mode": lite.execute("PRAGMA journal_mode").fetchone()[0],
            "synchronous": lite.execute("PRAGMA synchronous").fetchone()[0],
        }
    finally:
        lite.close()


def main() -> None:
    args = common.parse()
    common.configure(args)
    url = args.db if "://" in args.db else f"sqlite:///{args.db}"
    if args.workload == "reset":
        reset(url)
        return
    DBOS(
        config={
            "name": "idem-bench-peers",
            "system_database_url": url,
            "log_level": "WARNING",
        }
    )
    DBOS.launch()
    try:
        if args.workload == "steps":
            # Untimed: the first workflow pays for what is set up once.
            steps(10)
            samples = []
            for _ in range(args.turns):
                t = time.perf_counter()
                steps(args.n)
                samples.append((time.perf_counter() - t) * 1e6 / args.n)
            common.report(per_step_us=samples, mode=mode(url))
        elif args.workload == "short":
            # Untimed: the first workflow pays for what is set up once.
            steps(10)
            samples = []
            for _ in range(args.turns):
                t = time.perf_counter()
                for _ in range(args.n):
                    steps(1)
                samples.append(args.n / (time.perf_counter() - t))
            common.report(per_second=samples, mode=mode(url))
        elif args.workload == "crash":
            with SetWorkflowID(args.id):
                crash(args.n)
        elif args.workload == "resume":
            # launch() has already handed the pending workflow to a recovery thread.
            handle: WorkflowHandle[int] = DBOS.retrieve_workflow(args.id)
            done = handle.get_result(polling_interval_sec=0.005)
            common.report(done=done)
    finally:
        DBOS.destroy()


if __name__ == "__main__":
    main()
