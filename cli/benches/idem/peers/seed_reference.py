"""The seed's reference class: the classic durable-step pattern on Python's sqlite3 in
WAL mode, as the write-up this project starts from measured it (issue 4): per step a
claim transaction, the side effect, a transaction recording its result, and one saving
the run's progress — three commits, ``PRAGMA synchronous`` as ``--sync`` says.

A resumed run starts at its saved progress; a step claimed but never recorded is in
doubt and is run again.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Callable

import common


class Reference:
    def __init__(self, path: str, sync: str) -> None:
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={sync.upper()}")
        self.db.executescript(
            """
            CREATE TABLE IF NOT EXISTS steps (
                run_id TEXT NOT NULL, step INTEGER NOT NULL, result TEXT,
                PRIMARY KEY (run_id, step));
            CREATE TABLE IF NOT EXISTS progress (
                run_id TEXT PRIMARY KEY, next INTEGER NOT NULL);
            """
        )

    def _tx(self, sql: str, params: tuple[object, ...]) -> None:
        self.db.execute("BEGIN IMMEDIATE")
        self.db.execute(sql, params)
        self.db.execute("COMMIT")

    def start(self, run_id: str) -> int:
        row = self.db.execute("SELECT next FROM progress WHERE run_id = ?", (run_id,)).fetchone()
        return int(row[0]) if row else 0

    def step(self, run_id: str, i: int, effect: Callable[[int], int]) -> int:
        self._tx("INSERT OR IGNORE INTO steps (run_id, step) VALUES (?, ?)", (run_id, i))
        value = effect(i)
        self._tx(
            "UPDATE steps SET result = ? WHERE run_id = ? AND step = ?",
            (str(value), run_id, i),
        )
        self._tx(
            "INSERT INTO progress (run_id, next) VALUES (?, ?) "
            "ON CONFLICT (run_id) DO UPDATE SET next = excluded.next",
            (run_id, i + 1),
        )
        return value

    def run(self, run_id: str, n: int, effect: Callable[[int], int]) -> None:
        for i in range(self.start(run_id), n):
            self.step(run_id, i, effect)

    def mode(self) -> dict[str, object]:
        return {
            "journal_mode": self.db.execute("PRAGMA journal_mode").fetchone()[0],
            "synchronous": self.db.execute("PRAGMA synchronous").fetchone()[0],
        }


def noop(i: int) -> int:
    return i


def main() -> None:
    args = common.parse()
    common.configure(args)
    ref = Reference(args.db, args.sync)
    if args.workload == "steps":
        # Untimed: the first workflow pays for what is set up once.
        ref.run(str(uuid.uuid4()), 10, noop)
        samples = []
        for _ in range(args.turns):
            t = time.perf_counter()
            ref.run(str(uuid.uuid4()), args.n, noop)
            samples.append((time.perf_counter() - t) * 1e6 / args.n)
        common.report(per_step_us=samples, mode=ref.mode())
    elif args.workload == "short":
        # Untimed: the first workflow pays for what is set up once.
        ref.run(str(uuid.uuid4()), 10, noop)
        samples = []
        for _ in range(args.turns):
            t = time.perf_counter()
            for _ in range(args.n):
                ref.run(str(uuid.uuid4()), 1, noop)
            samples.append(args.n / (time.perf_counter() - t))
        common.report(per_second=samples, mode=ref.mode())
    elif args.workload in ("crash", "resume"):
        ref.run(args.id, args.n, common.effect)
        common.report(done=args.n, mode=ref.mode())


if __name__ == "__main__":
    main()
