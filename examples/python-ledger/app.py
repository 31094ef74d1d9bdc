"""Example agent, the Python twin of ``examples/ledger``: appends one line per item to a
ledger file, exactly once per item, resuming from its checkpoint after any crash.

Input: ``{"items": ["apples", "pears"], "log": "/data/ledger.log"}``, where ``/data`` is
a folder the host grants (``--dir HOST::/data``). Output:
``{"processed": 2, "total": 11, "checksum": "<16 hex digits>"}``. For the same input
and run id, its keys, its log and its output are byte for byte the Rust ledger's.

Build: ``componentize-py componentize app -o python-ledger.wasm``.
"""

import os
from dataclasses import dataclass

import idem

FNV_OFFSET = 0xCBF2_9CE4_8422_2325
FNV_PRIME = 0x0000_0100_0000_01B3
MASK = (1 << 64) - 1


@dataclass
class Input:
    items: list
    log: str


def entry_of(item: str) -> dict:
    """What one append commits, derived from the item alone (FNV-1a of its bytes)."""
    h = FNV_OFFSET
    for b in item.encode():
        h = ((h ^ b) * FNV_PRIME) & MASK
    return {"bytes": len(item.encode()), "hash": h}


def add(totals: dict, entry: dict) -> dict:
    return {
        "total": totals["total"] + entry["bytes"],
        "checksum": ((totals["checksum"] ^ entry["hash"]) * FNV_PRIME) & MASK,
    }


def append(path: str, line: str) -> None:
    # One write, made durable before the step commits.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


@idem.agent
def run(input: Input) -> dict:
    checkpoint = idem.load()
    start, totals = (
        (checkpoint.step, checkpoint.state) if checkpoint else (0, {"total": 0, "checksum": 0})
    )
    for i, item in enumerate(input.items):
        if i < start:
            continue
        # Named by what it does (this position, this item): a resumed instance computes
        # the same key and skips an append committed before the crash.
        key = idem.Key.for_run("append", (i, item))

        def effect(step: idem.Step, item: str = item) -> dict:
            append(input.log, f"{step.key} attempt={step.attempt} token={step.token} item={item}\n")
            return entry_of(item)

        # The result and the next checkpoint are committed in one transaction.
        entry, _ = idem.run_once(key, effect, save=lambda e, i=i, t=totals: (i + 1, add(t, e)))
        totals = add(totals, entry)

    return {
        "processed": len(input.items),
        "total": totals["total"],
        "checksum": f"{totals['checksum']:016x}",
    }
