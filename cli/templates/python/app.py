"""{{name}}: an idem agent. For each item of its input it appends one line to
``/data/{{name}}.log`` (a folder granted with ``--dir HOST::/data``), exactly once per
item, and resumes from its checkpoint after any crash.

Input: ``{"items": ["a", "b"]}``. Output: ``{"written": 2}``.
"""

import os
from dataclasses import dataclass

import idem

LOG = "/data/{{name}}.log"


@dataclass
class Input:
    items: list


def append(line: str) -> None:
    # One write, durable before the step commits.
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


@idem.agent
def run(input: Input) -> dict:
    # The checkpoint's step is the index of the next item: a resumed run skips the
    # items it finished.
    checkpoint = idem.load()
    start = checkpoint.step if checkpoint else 0
    for i, item in enumerate(input.items):
        if i < start:
            continue
        # The key comes from what the step processes (its position, its item), never
        # from the time or an attempt: a resumed instance computes the same key.
        key = idem.Key.for_run("write", (i, item))

        def effect(step: idem.Step, item: str = item) -> None:
            # The side effect; ``step.token`` is a fencing token for a downstream.
            append(f"{step.key} token={step.token} item={item}\n")

        # The effect's result and the next checkpoint are committed in one transaction.
        idem.run_once(key, effect, save=(i + 1, None))
    return {"written": len(input.items)}
