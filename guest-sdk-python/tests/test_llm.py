"""``idem.llm`` against the fake host: a model call is one step whose committed result
is the response body (a replay makes no request and returns the same bytes), the
tool-call loop, 429 with ``Retry-After`` waited as a durable sleep, and the typed
errors: a missing key grant, an error status, retries spent, a malformed or too large
response, the turn limit. The wire formats of both providers."""

import contextlib
import io
import json
import os
import unittest
from unittest import mock

from fakehost import HostTestCase, InstanceEnded, idem

llm = idem.llm
ENV = {"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": "http://model.test/v1"}


def completion(serial, message, finish, usage=(10, 2, 4)):
    return json.dumps(
        {
            "id": f"chatcmpl-{serial}",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {
                "prompt_tokens": usage[0],
                "completion_tokens": usage[1],
                "prompt_tokens_details": {"cached_tokens": usage[2]},
            },
        }
    ).encode()


def calls(*names):
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"call_{n}",
                "type": "function",
                "function": {"name": n, "arguments": json.dumps({"q": n})},
            }
            for n in names
        ],
    }


class Model:
    """A stand-in model: tool calls for a conversation without tool results, then an
    answer naming the results; each body carries a serial number."""

    def __init__(self, tools=("lookup", "note")):
        self.tools = tools
        self.seen = []
        self.before = []  # replies to give first, in order, before answering

    def __call__(self, req):
        self.seen.append(req)
        if self.before:
            return self.before.pop(0)
        body = json.loads(req.body)
        results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
        if not results:
            return 200, [], completion(len(self.seen), calls(*self.tools), "tool_calls")
        answer = {"role": "assistant", "content": "answer: " + ", ".join(results)}
        return 200, [], completion(len(self.seen), answer, "stop", (20, 5, 0))


class Base(HostTestCase):
    def setUp(self):
        super().setUp()
        patch = mock.patch.dict(os.environ, ENV)
        patch.start()
        self.addCleanup(patch.stop)
        self.model = Model()
        self.host.server = self.model

    def chat(self):
        chat = llm.Conversation("c1")
        chat.system("be brief").user("hi")
        return chat

    def raised(self, kind, body):
        """Runs ``body`` as one instance; returns the ``kind`` it raised."""

        def catching():
            try:
                body()
            except kind as err:
                return err
            self.fail(f"no {kind.__name__} raised")

        got = self.resume(catching)
        self.assertIsInstance(got, kind)
        return got

    def resume(self, body):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            got = self.host.resume(body)
        self.stderr = err.getvalue()
        return got


class Calls(Base):
    def test_one_call_commits_the_body_and_a_replay_returns_it_without_a_request(self):
        client = llm.Client.openai("m")
        first = self.resume(lambda: client.complete(self.chat()))
        self.assertEqual(len(self.model.seen), 1)
        req = self.model.seen[0]
        self.assertEqual(req.authority, "model.test")
        self.assertEqual(req.path, "/v1/chat/completions")
        self.assertEqual(req.header("authorization"), "Bearer sk-test")
        self.assertEqual(req.header("idempotency-key"), "run-1/llm/c1/1")
        self.assertEqual(first.key, "run-1/llm/c1/1")
        self.assertEqual(first.outcome, idem.Outcome.EXECUTED)
        self.assertEqual(self.host.keys[first.key].committed, first.body.encode())
        self.assertEqual(first.usage, llm.Usage(10, 2, 4))
        self.assertEqual([c.name for c in first.message.tool_calls], ["lookup", "note"])
        again = self.resume(lambda: client.complete(self.chat()))
        self.assertEqual(len(self.model.seen), 1, "a replay makes no request")
        self.assertEqual(again.body, first.body)
        self.assertEqual(again.outcome, idem.Outcome.SKIPPED)

    def test_each_call_records_its_usage_spent_once_and_saved_on_replay(self):
        client = llm.Client.openai("gpt-test")
        first = self.resume(lambda: client.complete(self.chat()))
        self.assertEqual(
            self.host.usage, {first.key: ("gpt-test", idem._host.usage.Tokens(10, 2, 4), 0)}
        )
        self.resume(lambda: client.complete(self.chat()))
        self.resume(lambda: client.complete(self.chat()))
        model, tokens, replays = self.host.usage[first.key]
        self.assertEqual((model, tokens.input, replays), ("gpt-test", 10, 2))

    def test_a_commit_whose_instance_died_before_recording_is_spent_by_the_replay(self):
        client = llm.Client.openai("m")
        # The first instance commits, and dies before it records.
        with mock.patch.object(llm, "record_usage", side_effect=InstanceEnded("crash")):
            self.assertIsInstance(self.resume(lambda: client.complete(self.chat())), InstanceEnded)
        self.assertEqual(self.host.usage, {})
        again = self.resume(lambda: client.complete(self.chat()))
        self.assertEqual(again.outcome, idem.Outcome.SKIPPED)
        self.assertEqual(self.host.usage[again.key][2], 0, "spent, not saved")

    def test_record_usage_refuses_a_key_not_committed_and_absurd_counts(self):
        with self.assertRaises(llm.UnknownStep) as err:
            llm.record_usage("run-1/llm/c1/9", "m", llm.Usage(1, 1, 1))
        self.assertEqual(err.exception.key, "run-1/llm/c1/9")
        client = llm.Client.openai("m")
        reply = self.resume(lambda: client.complete(self.chat()))
        with self.assertRaises(llm.InvalidUsage):
            llm.record_usage(reply.key, "m", llm.Usage(10**10, 0, 0))
        with self.assertRaises(llm.InvalidUsage):
            llm.record_usage(reply.key, "", llm.Usage(1, 0, 0))
        self.assertEqual(self.host.usage[reply.key][2], 0, "nothing recorded")
        self.assertIs(llm.record_usage(reply.key, "m", reply.usage), llm.Recorded.SAVED)

    def test_other_messages_for_a_committed_turn_are_refused(self):
        client = llm.Client.openai("m")
        self.resume(lambda: client.complete(self.chat()))
        other = llm.Conversation("c1").user("something else")
        self.raised(idem.KeyReused, lambda: client.complete(other))
        self.assertEqual(len(self.model.seen), 1)

    def test_the_tool_loop_runs_each_tool_once_and_sums_the_usage(self):
        ran = []

        def tool(call, step):
            ran.append((call.name, step.key))
            return f"{call.name} done"

        client = llm.Client.openai("m")
        reply = self.resume(lambda: client.run_tools(self.chat(), [], 4, tool))
        self.assertEqual(reply.message.content, "answer: lookup done, note done")
        self.assertEqual(reply.usage, llm.Usage(30, 7, 4))
        self.assertEqual(
            ran,
            [
                ("lookup", "run-1/llm/c1/1/tool/call_lookup"),
                ("note", "run-1/llm/c1/1/tool/call_note"),
            ],
        )
        self.assertEqual(len(self.model.seen), 2)
        sent = json.loads(self.model.seen[1].body)["messages"]
        self.assertEqual(
            sent[-1], {"role": "tool", "content": "note done", "tool_call_id": "call_note"}
        )
        # Replayed: no model call, no tool run, the same answer byte for byte.
        again = self.resume(lambda: client.run_tools(self.chat(), [], 4, tool))
        self.assertEqual((len(self.model.seen), len(ran)), (2, 2))
        self.assertEqual(again.body, reply.body)

    def test_a_tool_that_fails_fails_the_loop_and_keeps_the_others(self):
        def tool(call, step):
            if call.name == "note":
                raise RuntimeError("disk full")
            return "ok"

        client = llm.Client.openai("m")
        err = self.raised(RuntimeError, lambda: client.run_tools(self.chat(), [], 4, tool))
        self.assertEqual(str(err), "disk full")
        self.assertEqual(self.host.keys["run-1/llm/c1/1/tool/call_lookup"].committed, b'"ok"')
        self.assertIsNone(self.host.keys["run-1/llm/c1/1/tool/call_note"].committed)

    def test_past_the_turn_limit_the_loop_fails_typed(self):
        self.model.before = [
            (200, [], completion(i, calls(f"t{i}"), "tool_calls")) for i in range(3)
        ]
        client = llm.Client.openai("m")
        err = self.raised(
            llm.TurnLimit, lambda: client.run_tools(self.chat(), [], 2, lambda c, s: "x")
        )
        self.assertEqual((err.conversation, err.turns), ("c1", 2))
        self.assertEqual(len(self.model.seen), 2)


class Failures(Base):
    def policy(self, attempts=3):
        return idem.RetryPolicy(max_attempts=attempts, initial_delay=0.1, max_delay=5, jitter=False)

    def test_a_429_with_retry_after_is_waited_as_a_durable_sleep(self):
        self.model.before = [(429, [("retry-after", b"2")], b"slow down")]
        client = llm.Client.openai("m", retry=self.policy())
        ended = self.resume(lambda: client.complete(self.chat()))
        self.assertIsInstance(ended, InstanceEnded, "the wait ends the instance")
        key = idem.Key("run-1/llm/c1/1")
        self.assertEqual(self.host.sleeps, {idem._retry.backoff_key(key, 1): 2000})
        self.assertIn("retrying in 2000 ms", self.stderr)
        self.assertIsNone(self.host.keys[key.text].holder, "released before the sleep")
        self.host.now_ms += 2000
        reply = self.resume(lambda: client.complete(self.chat()))
        self.assertEqual(reply.outcome, idem.Outcome.EXECUTED)
        self.assertEqual(len(self.model.seen), 2)
        self.assertEqual([int(r.header("idempotency-token")) for r in self.model.seen], [1, 2])

    def test_retry_after_is_capped_by_the_policy_and_read_in_milliseconds(self):
        self.model.before = [
            (503, [("retry-after", b"99999")], b""),
            (429, [("retry-after-ms", b"250")], b""),
        ]
        client = llm.Client.openai("m", retry=self.policy())
        self.resume(lambda: client.complete(self.chat()))
        self.host.now_ms += 5000
        self.resume(lambda: client.complete(self.chat()))
        self.assertEqual(sorted(self.host.sleeps.values()), [5000, 5250])

    def test_a_429_storm_past_the_policy_gives_up_typed_with_nothing_committed(self):
        self.model.before = [(429, [("retry-after", b"0")], b"")] * 5
        client = llm.Client.openai("m", retry=self.policy(3))
        got = self.raised(llm.GaveUp, lambda: client.complete(self.chat()))
        key = idem.Key("run-1/llm/c1/1")
        backoffs = {idem._retry.backoff_key(key, n): 0 for n in (1, 2)}
        self.assertEqual(self.host.sleeps, backoffs, "a sleep between attempts, none after")
        self.assertEqual(got.attempts, 3)
        self.assertEqual(got.last, "status 429")
        self.assertEqual(len(self.model.seen), 3)
        state = self.host.keys["run-1/llm/c1/1"]
        self.assertIsNone(state.committed)
        self.assertIsNone(state.holder)

    def test_malformed_truncated_error_and_too_large_responses_are_typed(self):
        big = completion(1, {"role": "assistant", "content": "x" * 2000}, "stop")
        cases = [
            ((200, [], b'{"choices":[{"message":{"content":"cut'), llm.Malformed),
            ((200, [], b"<html>gateway</html>"), llm.Malformed),
            ((200, [], b'{"choices":[]}'), llm.Malformed),
            ((401, [], b"bad key"), llm.ModelStatus),
            ((200, [], big), llm.ResponseTooLarge),
        ]
        for reply, kind in cases:
            with self.subTest(kind=kind.__name__, body=reply[2][:30]):
                self.model.before = [reply]
                client = llm.Client.openai("m", retry=self.policy(), max_response_bytes=1000)
                seen = len(self.model.seen)
                self.raised(kind, lambda c=client: c.complete(self.chat()))
                self.assertEqual(len(self.model.seen), seen + 1, "not retried")
                state = self.host.keys["run-1/llm/c1/1"]
                self.assertIsNone(state.committed, "nothing recorded")
                self.assertIsNone(state.holder, "the claim released")

    def test_the_repr_leaves_the_key_out(self):
        text = repr(llm.Client.openai("m"))
        self.assertNotIn("sk-test", text)
        self.assertIn("api_key=<granted>", text)

    def test_a_missing_key_grant_is_typed_and_sends_nothing(self):
        with (
            mock.patch.dict(os.environ, {"OPENAI_API_KEY": ""}),
            self.assertRaises(llm.MissingKey) as caught,
        ):
            llm.Client.openai("m")
        self.assertEqual(caught.exception.var, "OPENAI_API_KEY")
        self.assertIn("OPENAI_API_KEY is not granted", str(caught.exception))
        with (
            mock.patch.dict(os.environ, {"OPENAI_BASE_URL": "model.test"}),
            self.assertRaises(llm.BadEndpoint),
        ):
            llm.Client.openai("m")
        self.assertEqual(self.model.seen, [])


class Wire(unittest.TestCase):
    def conversation(self):
        return [
            llm.Message.system("be brief"),
            llm.Message.user("weather in Oslo?"),
            llm.Message(
                "assistant",
                "",
                [
                    llm.ToolCall("c1", "weather", '{"city":"Oslo"}'),
                    llm.ToolCall("c2", "time", "{}"),
                ],
            ),
            llm.Message.tool("c1", "rain"),
            llm.Message.tool("c2", "noon"),
        ]

    def test_anthropic_requests_lift_the_system_prompt_and_merge_tool_results(self):
        tool = llm.Tool("weather", "the weather", {"type": "object"})
        body = json.loads(
            llm.request_body(llm.Provider.ANTHROPIC, "m", 64, self.conversation(), [tool])
        )
        self.assertEqual(body["system"], "be brief")
        self.assertEqual(len(body["messages"]), 3)
        self.assertEqual(
            body["messages"][1]["content"][0],
            {"type": "tool_use", "id": "c1", "name": "weather", "input": {"city": "Oslo"}},
        )
        self.assertEqual([b["tool_use_id"] for b in body["messages"][2]["content"]], ["c1", "c2"])
        self.assertEqual(body["tools"][0]["input_schema"], {"type": "object"})

    def test_openai_requests_carry_tool_calls_and_results(self):
        body = json.loads(llm.request_body(llm.Provider.OPENAI, "m", 64, self.conversation(), []))
        self.assertEqual(
            body["messages"][2]["tool_calls"][0]["function"],
            {"name": "weather", "arguments": '{"city":"Oslo"}'},
        )
        self.assertEqual(body["messages"][4]["tool_call_id"], "c2")
        self.assertNotIn("tools", body)

    def test_anthropic_responses_give_text_calls_and_usage(self):
        p = llm.parse(
            llm.Provider.ANTHROPIC,
            json.dumps(
                {
                    "content": [
                        {"type": "text", "text": "let me see"},
                        {"type": "tool_use", "id": "t1", "name": "w", "input": {"city": "Oslo"}},
                        {"type": "thinking"},
                    ],
                    "stop_reason": "tool_use",
                    "usage": {"input_tokens": 3, "output_tokens": 4, "cache_read_input_tokens": 2},
                }
            ).encode(),
        )
        self.assertEqual(p.message.content, "let me see")
        self.assertEqual(p.message.tool_calls, [llm.ToolCall("t1", "w", '{"city":"Oslo"}')])
        self.assertEqual((p.stop_reason, p.usage), ("tool_use", llm.Usage(3, 4, 2)))
        with self.assertRaises(ValueError):
            llm.parse(llm.Provider.ANTHROPIC, b'{"content":')


if __name__ == "__main__":
    unittest.main()
