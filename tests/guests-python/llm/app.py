"""Test agent, the Python twin of ``tests/guests/llm``: a tool-using conversation
through ``idem.llm`` against the stand-in model server of ``tests/all/llm.rs``, with the
same input, keys, requests and output, so the same tests run on both.

Input: ``{"provider": "openai", "conversation": "c1", "prompt": "...", "tool_url":
"http://127.0.0.1:PORT", "max_turns": 4, "manual": false, "retry": {"max_attempts": 3,
"initial_ms": 100, "max_ms": 5000}, "max_response_bytes": null, "stream": false}``.
With ``stream`` the client streams each call, publishing its text as it comes. Tools: ``lookup``
POSTs its arguments to ``{tool_url}/tool/lookup`` under its step and answers the
response's text; ``note`` appends the line ``{key} {token} {first|in-doubt}
{arguments}`` to ``/data/notes.log``. With ``manual`` the loop is written out with
``Client.complete`` and ``run_once_all``; with ``"chat": N``, instead, N turns without
tools, a user message before each. With ``"probe": [{"key", "model", "tokens": [in,
out, cached]}, ..]``, after the tool loop, each entry is recorded with
``llm.record_usage`` and its answer (``spent``, ``saved`` or the error's text) reported
in ``recorded``.

Output: ``{"answer": text, "usage": [in, out, cached], "turns": [{"turn", "key",
"body", "outcome"}, ..], "recorded": [..]}``.
"""

import os
from typing import Any

import idem
from idem import llm

TOOLS = [
    llm.Tool(
        "lookup", "Looks a word up", {"type": "object", "properties": {"q": {"type": "string"}}}
    ),
    llm.Tool(
        "note", "Writes a note down", {"type": "object", "properties": {"text": {"type": "string"}}}
    ),
]


def run_tool(tool_url: str, call: llm.ToolCall, step: idem.Step) -> str:
    if call.name == "lookup":
        r = idem.http.request(
            "POST",
            f"{tool_url}/tool/lookup",
            headers={"content-type": "application/json"},
            body=call.arguments,
            under=step,
        )
        return r.text
    if call.name == "note":
        with open("/data/notes.log", "a") as f:
            doubt = "in-doubt" if step.in_doubt else "first"
            f.write(f"{step.key} {step.token} {doubt} {call.arguments}\n")
            f.flush()
            os.fsync(f.fileno())
        return "noted"
    return f"no tool called {call.name}"


def probe(probes: list[dict[str, Any]]) -> list[str]:
    """Records each probe; what the host answered."""
    answers = []
    for p in probes:
        i, o, c = p["tokens"]
        try:
            answers.append(llm.record_usage(p["key"], p["model"], llm.Usage(i, o, c)).value)
        except llm.UsageError as err:
            answers.append(str(err))
    return answers


@idem.agent
def run(input: dict) -> dict:
    kw: dict[str, Any] = {}
    retry = input.get("retry")
    if retry:
        kw["retry"] = idem.RetryPolicy(
            max_attempts=retry["max_attempts"],
            initial_delay=retry["initial_ms"] / 1000,
            max_delay=retry["max_ms"] / 1000,
            jitter=False,
        )
    if input.get("max_response_bytes") is not None:
        kw["max_response_bytes"] = input["max_response_bytes"]
    if input.get("stream"):
        kw["stream"] = True
    if input.get("provider") == "anthropic":
        client = llm.Client.anthropic("stand-in", **kw)
    else:
        client = llm.Client.openai("stand-in", **kw)
    chat = llm.Conversation(input.get("conversation", "c1"))
    chat.system("You are a test.").user(input["prompt"])
    tool_url = input["tool_url"]
    max_turns = input.get("max_turns", 4)
    if input.get("chat"):
        # `chat` turns without tools, a user message before each.
        total = llm.Usage()
        answer = ""
        for i in range(input["chat"]):
            chat.user(f"question {i}")
            r = client.complete(chat, [])
            total = total + r.usage
            answer = r.message.content
        return {
            "answer": answer,
            "usage": [total.input_tokens, total.output_tokens, total.cached_tokens],
            "turns": [],
        }
    if not input.get("manual"):
        reply = client.run_tools(
            chat, TOOLS, max_turns, lambda call, step: run_tool(tool_url, call, step)
        )
        u = reply.usage
        return {
            "answer": reply.message.content,
            "usage": [u.input_tokens, u.output_tokens, u.cached_tokens],
            "turns": [],
            "recorded": probe(input.get("probe", [])),
        }
    turns = []
    usage = llm.Usage()
    while True:
        reply = client.complete(chat, TOOLS)
        usage = usage + reply.usage
        turns.append(
            {
                "turn": reply.turn,
                "key": reply.key,
                "body": reply.body,
                "outcome": reply.outcome.value,
            }
        )
        calls = reply.message.tool_calls
        if not calls:
            return {
                "answer": reply.message.content,
                "usage": [usage.input_tokens, usage.output_tokens, usage.cached_tokens],
                "turns": turns,
            }
        if reply.turn >= max_turns:
            raise idem.IdemError("turn limit")
        keys = [idem.Key(f"{reply.key}/tool/{c.id}") for c in calls]
        by_key = {k.text: c for k, c in zip(keys, calls, strict=True)}

        def tools(steps: list[idem.Step], by_key: dict[str, llm.ToolCall] = by_key) -> list[str]:
            return [run_tool(tool_url, by_key[s.key], s) for s in steps]

        done = idem.run_once_all(keys, tools)
        for call, (result, _) in zip(calls, done, strict=True):
            chat.push(llm.Message.tool(call.id, result))
