"""Test agent, the Python twin of ``tests/guests/fanout``: a parent that spawns one
child run per item, joins them, and reports what its children answered; the same
input, spawn keys, child inputs and output, so the same tests run on both.

Input (all optional but ``deployment``): ``{"deployment": "fetcher", "children": 5,
"url": "http://127.0.0.1:PORT", "pause_ms": 0, "mode": "all", "timeout_ms": null,
"fail": [], "child_input": null, "join_also": null, "recurse": null, "depth": 0,
"checkpoint": true, "batch": 0}``.

Child ``i`` is spawned under key ``item-{i}`` with input ``{"pause_after": true,
"pause_ms": P, "steps": 1, "url": URL}`` (the ``fetcher`` agent's), or ``{"fail":
true}`` for the items listed in ``fail``; ``child_input``: the input of every child
instead (for children of another agent). ``mode``: ``all`` joins every child
(``idem.join_all``, key ``all``), ``any`` the first to end (``idem.join_any``, key
``first``). ``join_also``: a run id joined with the children (to see a join refused).
``checkpoint``: save the children's ids once all are spawned, so a resumed instance
joins them without spawning again. ``batch``: spawn the children ``batch`` at a time
with ``idem.spawn_many`` (0: one by one with ``idem.spawn``). ``recurse``: ``{"key": K,
"vary": bool}``: spawn ``deployment`` (this agent) under key ``K`` (or ``K-{depth}``
with ``vary``) with this input one deeper, join it, and return what it answered.

Output: ``{"bodies": [..], "cancelled": X, "completed": C, "failed": F, "first": I,
"spawned": N}`` (``first`` for ``any``), or for ``recurse`` ``{"child": ..., "depth":
D}`` (``{"depth": D, "refused": text}`` where a spawn was refused).
"""

import idem


def normalized(input):
    """The input with every field, in the Rust guest's order: what ``recurse`` passes on."""
    recurse = input.get("recurse")
    return {
        "deployment": input["deployment"],
        "children": input.get("children", 0),
        "url": input.get("url", ""),
        "pause_ms": input.get("pause_ms", 0),
        "mode": input.get("mode"),
        "timeout_ms": input.get("timeout_ms"),
        "fail": input.get("fail", []),
        "child_input": input.get("child_input"),
        "join_also": input.get("join_also"),
        "recurse": None
        if recurse is None
        else {"key": recurse["key"], "vary": recurse.get("vary", False)},
        "depth": input.get("depth", 0),
        "checkpoint": input.get("checkpoint", True),
        "batch": input.get("batch", 0),
    }


def spawn_children(input):
    """Spawns the children, or finds them in the checkpoint."""
    if input["checkpoint"]:
        saved = idem.load()
        if saved is not None:
            return [idem.Child(run_id) for run_id in saved.state]

    def child_input(i):
        if input["child_input"] is not None:
            return input["child_input"]
        if i in input["fail"]:
            return {"fail": True}
        return {
            "pause_after": True,
            "pause_ms": input["pause_ms"],
            "steps": 1,
            "url": input["url"],
        }

    kids = []
    batch = input["batch"]
    if batch == 0:
        for i in range(input["children"]):
            kids.append(idem.spawn(f"item-{i}", input["deployment"], child_input(i)))
    else:
        specs = [
            idem.ChildSpec(f"item-{i}", input["deployment"], child_input(i))
            for i in range(input["children"])
        ]
        for start in range(0, len(specs), batch):
            for answer in idem.spawn_many(specs[start : start + batch]):
                if isinstance(answer, idem.SpawnError):
                    raise answer
                kids.append(answer)
    if input["checkpoint"]:
        idem.save(1, kids)
    return kids


def tally(outcomes):
    completed = failed = cancelled = 0
    bodies = []
    for outcome in outcomes:
        match outcome:
            case idem.ChildOutcome.Completed(out):
                completed += 1
                replies = out.get("replies") if isinstance(out, dict) else None
                bodies.extend(reply.get("body") for reply in replies or [])
            case idem.ChildOutcome.Failed(error):
                failed += 1
                bodies.append(f"failed: {error}")
            case idem.ChildOutcome.Cancelled():
                cancelled += 1
    return {"bodies": bodies, "cancelled": cancelled, "completed": completed, "failed": failed}


def recurse_once(input):
    recurse = input["recurse"]
    key = f"{recurse['key']}-{input['depth']}" if recurse["vary"] else recurse["key"]
    deeper = {**input, "depth": input["depth"] + 1}
    try:
        child = idem.spawn(key, input["deployment"], deeper)
    except idem.SpawnError as refused:
        # The end of the chain: its reason is this run's answer.
        return {"depth": input["depth"], "refused": str(refused)}
    match idem.join(child):
        case idem.ChildOutcome.Completed(value):
            answer = value
        case idem.ChildOutcome.Failed(error):
            answer = {"failed": error}
        case _:
            answer = "cancelled"
    return {"child": answer, "depth": input["depth"]}


@idem.agent
def run(input):
    input = normalized(input)
    if input["recurse"] is not None:
        return recurse_once(input)
    kids = spawn_children(input)
    timeout = None if input["timeout_ms"] is None else input["timeout_ms"] / 1000
    joined = list(kids)
    if input["join_also"] is not None:
        joined.append(idem.Child(input["join_also"]))
    if input["mode"] == "any":
        first, outcome = idem.join_any("first", joined, timeout)
        return {**tally([outcome]), "first": first, "spawned": len(kids)}
    outcomes = idem.join_all("all", joined, timeout)
    return {**tally(outcomes), "spawned": len(kids)}
