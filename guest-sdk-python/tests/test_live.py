"""``idem.publish`` and the model client's streaming mode against the fake host: text
published under a step's key, bad keys and oversized text refused; a streamed call
(OpenAI and Anthropic server-sent events, read five bytes at a time) publishes each
piece of text as it arrives and commits the response the same call answers without
streaming, so a replay returns it byte for byte and publishes nothing; the key does not
depend on streaming; a truncated stream fails typed, its claim released."""

import json
import os
from unittest import mock

from fakehost import HostTestCase
from test_llm import Base, completion

import idem

llm = idem.llm


class Publish(HostTestCase):
    def test_publish_hands_text_to_the_host_and_bad_ones_are_refused(self):
        idem.publish("run-1/summary", "Sum")
        idem.publish("run-1/summary", "")
        idem.publish("run-1/summary", "ming up")
        self.assertEqual(
            self.host.published, [("run-1/summary", "Sum"), ("run-1/summary", "ming up")]
        )
        with self.assertRaises(idem.InvalidLiveKey):
            idem.publish("", "x")
        with self.assertRaises(idem.LiveTooLarge) as err:
            idem.publish("k", "x" * (idem.MAX_CHUNK_BYTES + 1))
        self.assertEqual(err.exception.bound, idem.MAX_CHUNK_BYTES)
        self.assertIsInstance(err.exception, idem.LiveError)
        self.assertEqual(len(self.host.published), 2, "nothing published when refused")


def openai_events(body):
    """The plain OpenAI answer ``body`` as the events of a stream: the text three
    characters at a time, tool calls' arguments in two pieces, the stop, the usage."""
    v = json.loads(body)
    choice, events = v["choices"][0], []

    def chunk(delta, finish=None):
        return {"id": v["id"], "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    events.append(chunk({"role": "assistant", "content": ""}))
    text = choice["message"].get("content") or ""
    events += [chunk({"content": text[i : i + 3]}) for i in range(0, len(text), 3)]
    for i, call in enumerate(choice["message"].get("tool_calls") or []):
        args = call["function"]["arguments"]
        half = len(args) // 2
        head = {"index": i, "id": call["id"], "type": "function"}
        head["function"] = {"name": call["function"]["name"], "arguments": args[:half]}
        events.append(chunk({"tool_calls": [head]}))
        events.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": args[half:]}}]}))
    events.append(chunk({}, choice["finish_reason"]))
    events.append({"id": v["id"], "choices": [], "usage": v["usage"]})
    lines = [f"data: {json.dumps(e)}\n\n" for e in events] + ["data: [DONE]\n\n"]
    return "".join(lines).encode()


class Streams(Base):
    def setUp(self):
        super().setUp()
        plain = self.model

        def streaming(req):
            reply = plain(req)
            if json.loads(req.body).get("stream") is not True:
                return reply
            status, _headers, body = reply
            return status, [("content-type", b"text/event-stream")], openai_events(body)

        self.host.server = streaming

    def test_a_streamed_call_publishes_its_text_and_commits_the_plain_response(self):
        client = llm.Client.openai("m", stream=True)
        plain = llm.Client.openai("m")

        def loop(c):
            return c.run_tools(self.chat(), [], 4, lambda call, step: f"{call.name} done")

        reply = self.resume(lambda: loop(client))
        self.assertEqual(reply.message.content, "answer: lookup done, note done")
        sent = json.loads(self.model.seen[0].body)
        self.assertIs(sent["stream"], True)
        self.assertEqual(sent["stream_options"], {"include_usage": True})
        # The text came in pieces, each published as it arrived, under the call's key.
        keys = {key for key, _ in self.host.published}
        self.assertEqual(keys, {"run-1/llm/c1/2"})
        texts = [text for _, text in self.host.published]
        self.assertGreater(len(texts), 3)
        self.assertEqual("".join(texts), reply.message.content)
        # Committed: the plain response, with the tool calls and usage of the stream.
        first = json.loads(self.host.keys["run-1/llm/c1/1"].committed)
        self.assertEqual(first["object"], "chat.completion")
        calls = first["choices"][0]["message"]["tool_calls"]
        arguments = [c["function"]["arguments"] for c in calls]
        self.assertEqual(arguments, ['{"q": "lookup"}', '{"q": "note"}'])
        self.assertEqual(reply.usage, llm.Usage(30, 7, 4))
        # Replayed, streaming or not (the key is the same), byte for byte, publishing
        # nothing and asking nothing.
        published = len(self.host.published)
        for c in (client, plain):
            again = self.resume(lambda c=c: loop(c))
            self.assertEqual(again.body, reply.body)
            self.assertEqual(again.outcome, idem.Outcome.SKIPPED)
        self.assertEqual(len(self.model.seen), 2)
        self.assertEqual(len(self.host.published), published)

    def test_a_truncated_stream_is_malformed_and_commits_nothing(self):
        def cut(req):
            body = openai_events(completion(1, {"role": "assistant", "content": "hello"}, "stop"))
            return 200, [], body[: len(body) // 3]

        self.host.server = cut
        client = llm.Client.openai("m", stream=True)
        err = self.raised(llm.Malformed, lambda: client.complete(self.chat()))
        self.assertIn("the stream", str(err))
        self.assertIsNone(self.host.keys["run-1/llm/c1/1"].committed)
        self.assertIsNone(self.host.keys["run-1/llm/c1/1"].holder, "the claim was released")


class AnthropicStreams(Base):
    def test_an_anthropic_stream_assembles_text_tool_use_and_usage(self):
        events = [
            (
                "message_start",
                {
                    "type": "message_start",
                    "message": {
                        "id": "msg_1",
                        "type": "message",
                        "role": "assistant",
                        "model": "m",
                        "content": [],
                        "stop_reason": None,
                        "usage": {
                            "input_tokens": 12,
                            "output_tokens": 1,
                            "cache_read_input_tokens": 3,
                        },
                    },
                },
            ),
            (
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": ""},
                },
            ),
            (
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": "Let me "},
                },
            ),
            ("ping", {"type": "ping"}),
            (
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": "look."},
                },
            ),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            (
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": 1,
                    "content_block": {"type": "tool_use", "id": "t1", "name": "look", "input": {}},
                },
            ),
            (
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 1,
                    "delta": {"type": "input_json_delta", "partial_json": '{"q":'},
                },
            ),
            (
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 1,
                    "delta": {"type": "input_json_delta", "partial_json": '"x"}'},
                },
            ),
            ("content_block_stop", {"type": "content_block_stop", "index": 1}),
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "tool_use"},
                    "usage": {"output_tokens": 15},
                },
            ),
            ("message_stop", {"type": "message_stop"}),
        ]
        body = "".join(f"event: {n}\r\ndata: {json.dumps(d)}\r\n\r\n" for n, d in events).encode()
        seen = []

        def server(req):
            seen.append(json.loads(req.body))
            return 200, [], body

        self.host.server = server
        env = {"ANTHROPIC_API_KEY": "sk-test", "ANTHROPIC_BASE_URL": "http://model.test"}
        with mock.patch.dict(os.environ, env):
            client = llm.Client.anthropic("m", stream=True)
        reply = self.resume(lambda: client.complete(self.chat()))
        self.assertEqual(reply.message.content, "Let me look.")
        self.assertEqual(reply.message.tool_calls[0].arguments, '{"q":"x"}')
        self.assertEqual(reply.stop_reason, "tool_use")
        self.assertEqual(reply.usage, llm.Usage(12, 15, 3))
        self.assertEqual("".join(t for _, t in self.host.published), "Let me look.")
        self.assertIs(seen[0]["stream"], True)
        self.assertNotIn("stream_options", seen[0])
