"""Test agent, the Python twin of ``tests/guests/parallel``: the same input, keys,
requests and output, so the same tests run on both.

Input: ``{"url": "http://127.0.0.1:PORT", "batches": [3, 2], "fail": [],
"refuse_over": null}``. Each batch is one ``idem.run_once_all``; step ``i`` of batch
``b`` is named ``b{b}-{i}``, keyed ``Key.for_run("call", name)``, and its side effect is
``POST {url}/call/{name}`` with the name as body, all the batch's requests sent at once
with ``idem.http.send_all``, each tied to its own step. ``refuse_over``: first ask for
that many keys at once and expect ``idem.TooLarge``.

Output: ``{"replies": [[body, ..], ..], "outcomes": [["executed" | "reclaimed:N" |
"skipped" | "awaited", ..], ..], "refused": text | null, "stale": text | null}``.
"""

import functools

import idem


def refuse_over(n: int) -> str:
    keys = [idem.Key.for_run("over", i) for i in range(n)]
    try:
        idem.run_once_all(keys, lambda steps: [0 for _ in steps])
    except idem.TooLarge as err:
        return err.detail
    raise idem.IdemError(f"{n} claims at once were granted")


def outcome(o: idem.Outcome, attempt: int) -> str:
    return f"reclaimed:{attempt}" if o == idem.Outcome.RECLAIMED else o.value


def effects(
    url: str,
    by_key: dict[str, str],
    fail: set[str],
    attempts: dict[str, int],
    steps: list[idem.Step],
) -> list[object]:
    """One request per step, all in flight together, each tied to its own step."""
    for s in steps:
        attempts[s.key] = s.attempt
    responses = idem.http.send_all(
        idem.http.Request(
            "POST",
            f"{url}/call/{by_key[s.key]}",
            headers={"content-type": "text/plain"},
            body=by_key[s.key],
            under=s,
        )
        for s in steps
    )
    out: list[object] = []
    for s, r in zip(steps, responses, strict=True):
        if isinstance(r, Exception):
            out.append(r)
        elif by_key[s.key] in fail:
            out.append(idem.IdemError(f"{by_key[s.key]} failed as asked"))
        else:
            out.append(r.text)
    return out


def stale(url: str) -> str | None:
    """A request tied to a committed step: the host's refusal, as text."""
    settled: list[idem.Step] = []

    def first(steps: list[idem.Step]) -> list[object]:
        settled.extend(steps)
        return [0 for _ in steps]

    idem.run_once_all([idem.Key.for_run("stale", 0)], first)

    def send(step: idem.Step) -> str | None:
        if not settled:
            raise idem.IdemError("the first stale step ran elsewhere")
        try:
            idem.http.request("POST", f"{url}/stale", under=settled[0])
        except idem.HttpError as err:
            return str(err)
        return None

    refusal, _ = idem.run_once(idem.Key.for_run("stale", 1), send)
    return refusal


@idem.agent
def run(input: dict) -> dict:
    url = input["url"]
    fail = set(input.get("fail") or [])
    over = input.get("refuse_over")
    output: dict = {
        "replies": [],
        "outcomes": [],
        "refused": refuse_over(over) if over is not None else None,
        "stale": None,
    }
    for b, n in enumerate(input["batches"]):
        names = [f"b{b}-{i}" for i in range(n)]
        keys = [idem.Key.for_run("call", name) for name in names]
        by_key = {k.text: name for k, name in zip(keys, names, strict=True)}
        attempts: dict[str, int] = {}
        done = idem.run_once_all(keys, functools.partial(effects, url, by_key, fail, attempts))
        output["replies"].append([v for v, _ in done])
        if input.get("plain"):
            continue
        output["outcomes"].append(
            [outcome(o, attempts.get(k.text, 0)) for k, (_, o) in zip(keys, done, strict=True)]
        )
    if input.get("stale"):
        output["stale"] = stale(url)
    return output
