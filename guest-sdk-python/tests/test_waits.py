"""Durable waits against the fake host: what each asks the host, how a wait that is not
over ends the instance and a replay finds it over, and the refusals."""

import datetime as dt
import unittest
from typing import Any

from fakehost import HostTestCase, InstanceEnded, idem, types, waits


class Sleep(HostTestCase):
    def asked(self):
        return [c[1:] for c in self.host.calls if c[0] == "sleep"]

    def test_seconds_become_milliseconds_rounded(self):
        for seconds, ms in ((0, 0), (1.5, 1500), (0.0004, 0), (0.0006, 1), (3600, 3_600_000)):
            with self.subTest(seconds):
                self.host.calls.clear()
                self.host.resume(lambda s=seconds: idem.sleep(f"s-{s}", s))
                self.assertEqual(self.asked(), [(f"s-{seconds}", waits.Wake_After(ms))])

    def test_a_sleep_ends_the_instance_until_due_then_returns_at_once(self):
        ended = self.host.resume(lambda: idem.sleep("backoff", 60))
        self.assertIsInstance(ended, InstanceEnded)
        self.host.now_ms = 59_999
        self.assertIsInstance(self.host.resume(lambda: idem.sleep("backoff", 60)), InstanceEnded)
        self.host.now_ms = 60_000
        self.assertIsNone(self.host.resume(lambda: idem.sleep("backoff", 60)))

    def test_an_endless_sleep_is_left_to_the_host_to_refuse(self):
        self.host.refuse["sleep"] = waits.WaitError_InvalidTime("beyond what the host keeps")
        with self.assertRaises(idem.InvalidTime):
            idem.sleep("k", float("inf"))
        self.assertEqual(self.asked(), [("k", waits.Wake_After(2**64 - 1))])

    def test_bad_durations_are_refused_before_the_host_is_asked(self):
        for bad, exc in (
            (-1, ValueError),
            (float("nan"), ValueError),
            ("5", TypeError),
            (True, TypeError),
        ):
            with self.subTest(bad), self.assertRaises(exc):
                idem.sleep("k", bad)
        self.assertEqual(self.asked(), [])

    def test_sleep_until_takes_an_aware_datetime_or_epoch_seconds(self):
        when = dt.datetime(2030, 1, 2, 3, 4, 5, 678_000, tzinfo=dt.timezone.utc)
        self.host.now_ms = 2**62
        idem.sleep_until("a", when)
        idem.sleep_until("b", 1_700_000_000.25)
        idem.sleep_until("c", -1)
        self.assertEqual(
            self.asked(),
            [
                ("a", waits.Wake_At(round(when.timestamp() * 1000))),
                ("b", waits.Wake_At(1_700_000_000_250)),
                ("c", waits.Wake_At(-1000)),
            ],
        )
        with self.assertRaisesRegex(ValueError, "aware datetime"):
            idem.sleep_until("d", dt.datetime(2030, 1, 1))
        with self.assertRaises(ValueError):
            idem.sleep_until("d", float("nan"))
        with self.assertRaises(TypeError):
            idem.sleep_until("d", "tomorrow")

    def test_a_sleep_while_holding_a_claim_is_claims_held(self):
        with idem.once("k") as step:
            with self.assertRaises(idem.ClaimsHeld) as caught:
                idem.sleep("s", 1)
            step.commit(None)
        self.assertTrue(str(caught.exception).startswith("claims held: "))


class RateTokens(HostTestCase):
    def agent(self, effects: list[str]) -> list[Any]:
        """Three steps of the class "llm", each counting its effect."""

        def call(i: int) -> Any:
            effects.append(f"call-{i}")
            return i

        return [
            idem.run_once(f"call-{i}", lambda _s, i=i: call(i), rate="llm")[0] for i in range(3)
        ]

    def test_an_unlimited_class_hands_its_tokens_out_at_once(self):
        effects: list[str] = []
        self.assertEqual(self.host.resume(lambda: self.agent(effects)), [0, 1, 2])
        self.assertEqual(effects, ["call-0", "call-1", "call-2"])
        takes = [(c[1], c[4]) for c in self.host.calls if c[0] == "run_once_rated"]
        self.assertEqual(takes, [("call-0", "llm"), ("call-1", "llm"), ("call-2", "llm")])

    def test_a_step_over_the_limit_waits_and_a_replay_takes_no_other_token(self):
        self.host.rates["llm"] = 1_000
        effects: list[str] = []
        # The first token is free now; the second is a second away: the instance ends
        # before the second step claims anything.
        self.assertIsInstance(self.host.resume(lambda: self.agent(effects)), InstanceEnded)
        self.assertEqual(effects, ["call-0"])
        self.assertEqual(self.host.tokens, {"rate:call-0": 0, "rate:call-1": 1_000})
        self.host.now_ms = 1_000
        self.assertIsInstance(self.host.resume(lambda: self.agent(effects)), InstanceEnded)
        self.host.now_ms = 2_000
        self.assertEqual(self.host.resume(lambda: self.agent(effects)), [0, 1, 2])
        # Each effect ran once, and each step took one token, replays included.
        self.assertEqual(effects, ["call-0", "call-1", "call-2"])
        self.assertEqual(len(self.host.tokens), 3)
        self.assertEqual(self.host.next_token["llm"], 3_000)

    def test_the_with_form_takes_its_token_with_the_claim(self):
        self.host.rates["llm"] = 500
        with idem.once("a", rate="llm") as step:
            step.commit(1)
        self.assertEqual([c[0] for c in self.host.calls[:2]], ["run_once_rated", "run_once"])
        self.assertIsInstance(
            self.host.resume(lambda: idem.once("b", rate="llm").__enter__()), InstanceEnded
        )
        self.assertNotIn("b", self.host.keys)

    def test_a_refused_class_raises_the_wait_error(self):
        with self.assertRaises(idem.InvalidWaitKey):
            idem.take_token("k", "")
        self.host.refuse["run_once_rated"] = types.StepError_InvalidKey("class name holds a tab")
        with self.assertRaises(idem.InvalidKey):
            idem.run_once("k", lambda _s: 1, rate="a\tb")
        self.assertNotIn("k", self.host.keys)


class Signals(HostTestCase):
    def test_a_signal_sent_before_the_wait_is_taken_and_kept_for_replays(self):
        self.host.signals["approval"] = [b'{"by":"alice"}', b'{"by":"bob"}']
        self.assertEqual(idem.wait_for_signal("w-0", "approval"), {"by": "alice"})
        self.assertEqual(idem.wait_for_signal("w-0", "approval"), {"by": "alice"})
        self.assertEqual(idem.wait_for_signal("w-1", "approval", timeout=60), {"by": "bob"})
        self.assertEqual(
            [c[1:] for c in self.host.calls if c[0] == "wait"][-1], ("w-1", "approval", 60_000)
        )

    def test_no_signal_ends_the_instance_and_a_timeout_raises_timed_out(self):
        ended = self.host.resume(lambda: idem.wait_for_signal("w", "go"))
        self.assertIsInstance(ended, InstanceEnded)
        with self.assertRaises(idem.TimedOut) as caught:
            idem.wait_for_signal("late", "go", timeout=0)
        self.assertEqual(caught.exception.name, "go")
        self.assertEqual(str(caught.exception), "timed out waiting for signal 'go'")

    def test_a_payload_that_is_not_json_is_a_codec_error(self):
        self.host.signals["go"] = [b"\xff not json"]
        with self.assertRaisesRegex(idem.CodecError, "signal payload"):
            idem.wait_for_signal("w", "go")

    def test_each_wait_error_is_its_exception(self):
        cases = [
            (waits.WaitError_InvalidKey, idem.InvalidWaitKey, "invalid wait key"),
            (waits.WaitError_InvalidTime, idem.InvalidTime, "invalid time"),
            (waits.WaitError_KeyReused, idem.WaitKeyReused, "wait key reused"),
            (waits.WaitError_ClaimsHeld, idem.ClaimsHeld, "claims held"),
        ]
        for case, cls, prefix in cases:
            with self.subTest(cls.__name__):
                self.host.refuse["wait"] = case("why")
                with self.assertRaises(cls) as caught:
                    idem.wait_for_signal("w", "go")
                self.assertIsInstance(caught.exception, idem.WaitError)
                self.assertEqual(str(caught.exception), f"{prefix}: why")


if __name__ == "__main__":
    unittest.main()
