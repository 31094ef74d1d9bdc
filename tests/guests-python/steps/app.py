"""Test agent, the Python twin of ``tests/guests/steps``: the same input, the same log
lines, the same keys and the same output, so the same tests run on both.

Input: ``{"steps": 5, "log": "/data/log.txt", "spin": 0, "fail_at": null,
"shared": false, "policy": "retry", "fold": false, "url": null}``. With ``url``, each
effect also POSTs ``{"step": i}`` there (the loopback server counts them).

Each executed step appends
``{key} attempt={attempt} token={token} in_doubt={in_doubt} gen={generation}``.
Output: ``{"steps": N, "checksum": "<16 hex digits>"}``.
"""

import os

import idem

MASK = (1 << 64) - 1


def mix(acc: int, word: int) -> int:
    x = ((acc ^ word) * 0x0000_0100_0000_01B3) & MASK
    return ((x << 29) | (x >> 35)) & MASK


def spin(seed: int, iterations: int) -> int:
    x = mix(seed, 0x9E37_79B9_7F4A_7C15) | 1
    for _ in range(iterations):
        x ^= (x << 13) & MASK
        x ^= x >> 7
        x ^= (x << 17) & MASK
    return x


def append(path: str, line: str) -> None:
    # One write, durable before the step commits.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


@idem.agent
def run(input: dict) -> dict:
    steps = input["steps"]
    log = input["log"]
    checkpoint = idem.load()
    start, checksum = (checkpoint.step, checkpoint.state) if checkpoint else (0, 0)

    for i in range(start, steps):
        checksum = mix(checksum, spin(i, input.get("spin", 0)))
        key = idem.Key.shared("step", i) if input.get("shared") else idem.Key.for_run("step", i)

        def probe(step: idem.Step, i: int = i):
            try:
                with open(log) as f:
                    lines = f.read().splitlines()
            except FileNotFoundError:
                lines = []
            found = any(line.startswith(f"{step.key} ") for line in lines)
            return (True, mix(i, 0x5EED)) if found else (False, None)

        policy = {"retry": idem.RETRY, "fail": idem.FAIL, "probe": probe}[
            input.get("policy") or "retry"
        ]

        def effect(step: idem.Step, i: int = i) -> int:
            if input.get("fail_at") == i and step.attempt == 1:
                raise RuntimeError(f"step {i} fails on its first attempt")
            if input.get("url"):
                r = idem.http.post(f"{input['url']}/step/{i}", body=str(i))
                if not r.ok:
                    raise RuntimeError(f"POST refused with {r.status}")
            in_doubt = "true" if step.in_doubt else "false"
            append(
                log,
                f"{step.key} attempt={step.attempt} token={step.token} "
                f"in_doubt={in_doubt} gen={idem.generation()}\n",
            )
            return mix(i, 0x5EED)

        if input.get("with"):
            with idem.once(key, in_doubt=policy) as s:
                ran = not s.done
                if ran:
                    v = effect(s.step)
                    if input.get("fold"):
                        s.commit(v, save=(i + 1, mix(checksum, v)))
                    else:
                        s.commit(v)
                # Settled: committing twice raises, it does not trap.
                try:
                    s.commit(0)
                    raise AssertionError("a settled step accepted a second commit")
                except idem.ClaimSettled:
                    pass
            value = s.value
            if not (input.get("fold") and ran):
                idem.save(i + 1, mix(checksum, value))
        elif input.get("fold"):
            value, _ = idem.run_once(
                key,
                effect,
                in_doubt=policy,
                save=lambda v, i=i, c=checksum: (i + 1, mix(c, v)),
            )
        else:
            value, _ = idem.run_once(key, effect, in_doubt=policy)
            idem.save(i + 1, mix(checksum, value))
        checksum = mix(checksum, value)

    return {"steps": steps, "checksum": f"{checksum:016x}"}
