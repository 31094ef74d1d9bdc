"""Test agent, the Python twin of ``tests/guests/waiter``: the same input, the same log
lines, the same keys and the same output, so the same tests run on both.

Input: ``{"log": "/data/waiter.log", "waits": [{"sleep_ms": 3600000},
{"until_ms": 1700000000000}, {"signal": "approval", "timeout_ms": 60000}]}``.

A wait may instead be ``{"retry": {"fail": 2, "permanent": false, "max_attempts": 3,
"initial_ms": 1000, "jitter": false}}``: an ``idem.run_once_retry`` step (key
``flaky/{i}``) whose first ``fail`` attempts fail, each attempt appending ``try {i}
attempt={n} gen={generation}``; its ``what`` is ``ok-{attempt}`` or ``error: {message}``.

A wait may instead be ``{"rate": "llm"}``: a step (key ``rated/{i}``) of that rate
class, which takes a token of it first and appends ``rated {i} gen={generation}``; its
``what`` is ``rated``.

Wait ``i`` has the key ``wait-{i}``. The agent first appends ``start gen={generation}``
(once, under a key), then per wait, after it is over, appends
``after {i} {what} gen={generation}`` where ``what`` is ``slept``, ``timed-out``, or
the signal's payload as compact JSON. Output: ``{"results": [what, ...]}``.
"""

import json
import os

import idem


def append(path: str, line: str) -> None:
    # One write per line: runs appending at once never interleave their lines.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def retried(log, i, retry):
    """The ``retry`` wait: what the retried step ended with."""
    policy = idem.RetryPolicy(
        max_attempts=retry["max_attempts"],
        initial_delay=retry["initial_ms"] / 1000,
        jitter=retry.get("jitter", False),
    )

    def effect(step):
        try:
            append(log, f"try {i} attempt={step.attempt} gen={idem.generation()}")
        except OSError as err:
            raise idem.Transient(err) from err
        if step.attempt > retry["fail"]:
            return step.attempt
        if retry.get("permanent", False):
            raise idem.Permanent(f"refused {step.attempt}")
        raise idem.Transient(f"flaky {step.attempt}")

    try:
        attempt, _ = idem.run_once_retry(idem.Key.for_run("flaky", i), effect, policy=policy)
    except idem.EffectFailed as failed:
        return f"error: {failed.message}"
    return f"ok-{attempt}"


@idem.agent
def run(input):
    log = input["log"]
    idem.run_once(
        idem.Key.for_run("start", None),
        lambda step: append(log, f"start gen={idem.generation()}"),
    )
    results = []
    for i, wait in enumerate(input["waits"]):
        key = f"wait-{i}"
        if wait.get("retry") is not None:
            what = retried(log, i, wait["retry"])
        elif wait.get("rate") is not None:
            idem.run_once(
                idem.Key.for_run("rated", i),
                lambda step, i=i: append(log, f"rated {i} gen={idem.generation()}"),
                rate=wait["rate"],
            )
            what = "rated"
        elif wait.get("signal") is not None:
            timeout_ms = wait.get("timeout_ms")
            timeout = None if timeout_ms is None else timeout_ms / 1000
            try:
                payload = idem.wait_for_signal(key, wait["signal"], timeout)
                what = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
            except idem.TimedOut:
                what = "timed-out"
        elif wait.get("until_ms") is not None:
            idem.sleep_until(key, wait["until_ms"] / 1000)
            what = "slept"
        else:
            idem.sleep(key, wait.get("sleep_ms", 0) / 1000)
            what = "slept"
        idem.run_once(
            idem.Key.for_run("after", i),
            lambda step, i=i, what=what: append(log, f"after {i} {what} gen={idem.generation()}"),
        )
        results.append(what)
    return {"results": results}
