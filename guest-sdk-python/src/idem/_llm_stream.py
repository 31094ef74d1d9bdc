"""A streamed model response (the Rust SDK's ``llm/stream.rs``): the server-sent events
of an OpenAI chat completion (``stream: true`` with ``stream_options.include_usage``)
or an Anthropic Messages stream, read as they arrive. Each text delta is handed out at
once (to be published on the run's live stream); at the end the events are assembled
into the body the same call would have answered without streaming, which is what the
step commits: a replay decodes it like any other response."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["Assembler", "stream_request"]


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def stream_request(openai: bool, body: str) -> str:
    """The request ``body`` asking for a stream (and, from OpenAI, its usage)."""
    doc = json.loads(body)
    doc["stream"] = True
    if openai:
        doc["stream_options"] = {"include_usage": True}
    return _dumps(doc)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _index(event: dict[str, Any], where: str) -> int:
    index = event.get("index")
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index <= 1024:
        raise ValueError(f"{where} has no usable index")
    return index


class Assembler:
    """Reads a stream's bytes as they come and assembles its response."""

    def __init__(self, openai: bool) -> None:
        self.openai = openai
        self._pending = b""
        self._error: str | None = None
        self._ended = False
        # OpenAI
        self._id: Any = None
        self._model: Any = None
        self._content = ""
        self._calls: list[list[str]] = []
        self._finish: str | None = None
        self._usage: Any = None
        # Anthropic
        self._message: dict[str, Any] = {}
        self._blocks: list[tuple[dict[str, Any], list[str]]] = []
        self._delta: dict[str, Any] = {}
        self._a_usage: dict[str, Any] = {}

    def feed(self, data: bytes) -> list[str]:
        """Takes the next bytes of the body; returns the text deltas they complete."""
        self._pending += data
        deltas: list[str] = []
        while True:
            found = ((self._pending.find(sep), len(sep)) for sep in (b"\n\n", b"\r\n\r\n"))
            cuts = [(i, n) for i, n in found if i >= 0]
            if not cuts:
                return deltas
            end, sep = min(cuts)
            event, self._pending = self._pending[:end], self._pending[end + sep :]
            if self._error is None:
                self._event(event.decode("utf-8", "replace"), deltas)

    def finish(self) -> str:
        """The response body the stream amounts to; raises ``ValueError`` saying what is
        wrong with the stream."""
        if self._pending.strip():
            # A last event without its blank line: complete once the body ended.
            self._event(self._pending.decode("utf-8", "replace"), [])
            self._pending = b""
        if self._error is not None:
            raise ValueError(self._error)
        if not self._ended:
            raise ValueError("the stream ended before the response was complete")
        return self._openai_body() if self.openai else self._anthropic_body()

    def _event(self, event: str, deltas: list[str]) -> None:
        name, data = None, []
        for line in event.splitlines():
            field, sep, value = line.partition(":")
            if not sep:
                continue
            value = value[1:] if value.startswith(" ") else value
            if field == "event":
                name = value
            elif field == "data":
                data.append(value)
        text = "\n".join(data)
        if not text:
            return
        if self.openai and text.strip() == "[DONE]":
            self._ended = True
            return
        try:
            doc = json.loads(text)
        except ValueError as err:
            self._error = f"an event of the stream is not JSON: {err}"
            return
        if not isinstance(doc, dict):
            self._error = "an event of the stream is not a JSON object"
            return
        try:
            if self.openai:
                self._openai_chunk(doc, deltas)
            else:
                self._anthropic_event(name or _text(doc.get("type")), doc, deltas)
        except ValueError as err:
            self._error = str(err)

    def _openai_chunk(self, v: dict[str, Any], deltas: list[str]) -> None:
        if "error" in v:
            raise ValueError(f"the stream reported an error: {_dumps(v['error'])}")
        if self._id is None:
            self._id, self._model = v.get("id"), v.get("model")
        if isinstance(v.get("usage"), dict):
            self._usage = v["usage"]
        choices = v.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return
        choice = choices[0]
        delta = _obj(choice.get("delta"))
        piece = _text(delta.get("content"))
        if piece:
            self._content += piece
            deltas.append(piece)
        for call in delta.get("tool_calls") or []:
            index = _index(call, "a tool call's delta")
            while len(self._calls) <= index:
                self._calls.append(["", "", ""])
            slot = self._calls[index]
            fn = _obj(call.get("function"))
            if _text(call.get("id")):
                slot[0] = call["id"]
            slot[1] += _text(fn.get("name"))
            slot[2] += _text(fn.get("arguments"))
        if _text(choice.get("finish_reason")):
            self._finish = choice["finish_reason"]
            # Complete once a finish reason came (the usage chunk and `[DONE]` may
            # follow, and a compatible server may send neither).
            self._ended = True

    def _openai_body(self) -> str:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None if not self._content and self._calls else self._content,
        }
        if self._calls:
            message["tool_calls"] = [
                {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                for i, n, a in self._calls
            ]
        body: dict[str, Any] = {
            "id": self._id,
            "object": "chat.completion",
            "model": self._model,
            "choices": [{"index": 0, "message": message, "finish_reason": self._finish}],
        }
        if self._usage is not None:
            body["usage"] = self._usage
        return _dumps(body)

    def _block(self, v: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        index = _index(v, "a content block event")
        while len(self._blocks) <= index:
            self._blocks.append(({}, []))
        return self._blocks[index]

    def _anthropic_event(self, name: str, v: dict[str, Any], deltas: list[str]) -> None:
        if name == "message_start":
            message = v.get("message")
            self._message = dict(message) if isinstance(message, dict) else {}
            usage = self._message.get("usage")
            self._a_usage = dict(usage) if isinstance(usage, dict) else {}
        elif name == "content_block_start":
            index = _index(v, "a content block event")
            self._block(v)
            block = v.get("content_block")
            self._blocks[index] = (dict(block) if isinstance(block, dict) else {}, [])
        elif name == "content_block_delta":
            block, parts = self._block(v)
            delta = _obj(v.get("delta"))
            if delta.get("type") == "text_delta":
                piece = _text(delta.get("text"))
                block["text"] = _text(block.get("text")) + piece
                if piece:
                    deltas.append(piece)
            elif delta.get("type") == "input_json_delta":
                parts.append(_text(delta.get("partial_json")))
            # Thinking and signatures are not part of the reply this client reads.
        elif name == "content_block_stop":
            block, parts = self._block(v)
            if block.get("type") == "tool_use" and "".join(parts):
                try:
                    block["input"] = json.loads("".join(parts))
                except ValueError as err:
                    raise ValueError(f"a tool call's input is not JSON: {err}") from None
        elif name == "message_delta":
            delta = _obj(v.get("delta"))
            for k in ("stop_reason", "stop_sequence"):
                if k in delta:
                    self._delta[k] = delta[k]
            usage = v.get("usage")
            if isinstance(usage, dict):
                self._a_usage.update(usage)
        elif name == "message_stop":
            self._ended = True
        elif name == "error":
            raise ValueError(f"the stream reported an error: {_dumps(v.get('error'))}")

    def _anthropic_body(self) -> str:
        message = dict(self._message)
        message["content"] = [block for block, _ in self._blocks if block]
        message.update(self._delta)
        message["usage"] = self._a_usage
        return _dumps(message)
