"""Example agent, the Python twin of ``examples/llm-agent``: a tool-using model
conversation, each model turn and each tool call a step, so that a crash, a recycle or
a resume on another worker never pays for a turn twice nor runs a tool twice (but for a
retake in doubt).

Input: ``{"conversation": "ticket-17", "question": "...", "api":
"https://lookup.example.com", "notes": "/data/notes.log", "model": "gpt-4o-mini"}``
(``model`` optional). The model (OpenAI-compatible; its base URL and key are the granted
``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``) may call two tools: ``lookup``, which POSTs
its arguments to ``{api}/tool/lookup`` and answers the response's text, and ``note``,
which appends its text to the ``notes`` file. Output: ``{"answer": "...", "turns": 2,
"usage": {"input": 250, "output": 30, "cached": 50}}``, as the Rust agent's.

Build: ``componentize-py componentize app -o python-llm-agent.wasm``.
"""

import os

import idem
from idem import llm

TOOLS = [
    llm.Tool(
        "lookup",
        "Looks a term up in the company's knowledge base",
        {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
    ),
    llm.Tool(
        "note",
        "Writes a note for the support team",
        {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    ),
]


def run_tool(input: dict, call: llm.ToolCall, step: idem.Step) -> str:
    """Runs one tool call inside its step: what it returns is committed as the call's
    result and handed to the model."""
    if call.name == "lookup":
        # `under=step`: the request carries this call's key and token.
        r = idem.http.post(
            f"{input['api']}/tool/lookup",
            headers={"content-type": "application/json"},
            body=call.arguments,
            under=step,
        )
        if not r.ok:
            # Told to the model as the tool's answer, not a failure of the run.
            return f"lookup failed with status {r.status}"
        return r.text
    if call.name == "note":
        text = call.args()["text"]
        fd = os.open(input["notes"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{text}\n".encode())
            # Durable before the step commits: a commit never outlives its effect.
            os.fsync(fd)
        finally:
            os.close(fd)
        return "noted"
    return f"there is no tool called {call.name}"


@idem.agent
def run(input: dict) -> dict:
    client = llm.Client.openai(input.get("model", "gpt-4o-mini"))
    # Rebuilt the same way on every instance: the turns replay from the store.
    chat = llm.Conversation(input["conversation"])
    chat.system("You answer support questions. Use the tools when they help.")
    chat.user(input["question"])
    reply = client.run_tools(chat, TOOLS, 8, lambda call, step: run_tool(input, call, step))
    u = reply.usage
    return {
        "answer": reply.message.content,
        "turns": reply.turn,
        "usage": {"input": u.input_tokens, "output": u.output_tokens, "cached": u.cached_tokens},
    }
