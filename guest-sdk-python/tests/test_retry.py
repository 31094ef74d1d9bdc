"""``run_once_retry`` against the fake host: attempts across instances with durable
backoff, what is committed (the Rust SDK's encoding), jitter, and the policy's delays
(the same as the Rust SDK's doctest)."""

import contextlib
import io
import unittest

from fakehost import HostTestCase, InstanceEnded, idem, types, waits

retry = idem._retry


class Policy(unittest.TestCase):
    def test_delays_double_from_the_initial_one_up_to_the_longest(self):
        policy = idem.RetryPolicy(jitter=False)
        self.assertEqual(policy.max_attempts, 5)
        self.assertEqual(policy.delay(1), 1.0)
        self.assertEqual(policy.delay(3), 4.0)
        self.assertEqual(policy.delay(30), 300.0)
        self.assertEqual(policy.delay(1_000_000), 300.0)
        custom = idem.RetryPolicy(initial_delay=0.25, multiplier=3, max_delay=2, jitter=False)
        self.assertEqual([custom.delay_ms(n) for n in (1, 2, 3, 4)], [250, 750, 2000, 2000])
        self.assertEqual(idem.RetryPolicy(multiplier=0, jitter=False).delay_ms(4), 1000)

    def test_jitter_lands_between_half_and_all_of_the_delay(self):
        policy = idem.RetryPolicy()
        self.assertEqual(policy.delay_ms(3, random=0), 2000)
        self.assertEqual(policy.delay_ms(3, random=2000), 4000)
        self.assertEqual(policy.delay_ms(3, random=2001), 2000)
        for random in (1, 12345, 2**64 - 1):
            self.assertTrue(2000 <= policy.delay_ms(3, random) <= 4000)

    def test_a_negative_or_unknown_delay_is_refused(self):
        for bad in (-1, float("nan"), "1s"):
            with self.subTest(bad), self.assertRaises(ValueError):
                idem.RetryPolicy(initial_delay=bad).delay(1)

    def test_backoff_keys_are_fnv_1a_of_the_key_as_in_the_rust_sdk(self):
        # FNV-1a 64's published vectors: "" and "a".
        self.assertEqual(retry.backoff_key(idem.Key(""), 1), "retry-cbf29ce484222325-1")
        self.assertEqual(retry.backoff_key(idem.Key("a"), 7), "retry-af63dc4c8601ec8c-7")
        self.assertEqual(retry.backoff_key(idem.Key("foobar"), 2), "retry-85944171f73967e8-2")
        long = idem.Key("x" * 10_000)
        self.assertEqual(len(retry.backoff_key(long, 4)), len("retry--4") + 16)


class RunOnceRetry(HostTestCase):
    def flaky(self, fail, permanent=False):
        """An effect whose first ``fail`` attempts fail; records the attempts."""
        self.attempts = []

        def effect(step):
            self.attempts.append((step.attempt, self.host.generation))
            if step.attempt <= fail:
                cls = idem.Permanent if permanent else idem.Transient
                raise cls(f"{'refused' if permanent else 'flaky'} {step.attempt}")
            return {"ok": step.attempt}

        return effect

    def run_agent(self, effect, policy):
        """One instance: the retried step; returns its result or how the instance ended."""
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            got = self.host.resume(lambda: idem.run_once_retry("pay", effect, policy=policy))
        self.stderr = err.getvalue()
        return got

    def test_two_failures_back_off_durably_then_the_third_attempt_commits(self):
        effect = self.flaky(2)
        policy = idem.RetryPolicy(max_attempts=5, initial_delay=1, jitter=False)
        ended = self.run_agent(effect, policy)
        self.assertIsInstance(ended, InstanceEnded, "the backoff ends the instance")
        self.assertEqual(self.stderr, "attempt 1 of pay failed: flaky 1; retrying in 1000 ms\n")
        first = retry.backoff_key(idem.Key("pay"), 1)
        self.assertEqual(self.host.sleeps, {first: 1000})
        self.assertIsNone(self.host.keys["pay"].holder, "released before the sleep")

        # Resumed when the sleep is due: attempt 2 fails too, and backs off 2 s more.
        self.host.now_ms = 1000
        self.assertIsInstance(self.run_agent(effect, policy), InstanceEnded)
        second = retry.backoff_key(idem.Key("pay"), 2)
        self.assertEqual(self.host.sleeps[second], 3000)
        self.assertIn("retrying in 2000 ms", self.stderr)

        self.host.now_ms = 3000
        got = self.run_agent(effect, policy)
        self.assertEqual(got, ({"ok": 3}, idem.Outcome.EXECUTED))
        self.assertEqual(self.attempts, [(1, 0), (2, 1), (3, 2)])
        self.assertEqual(self.committed("pay"), b'{"Ok":{"ok":3}}')

        # A replay gets the committed value back without running the effect.
        got = self.run_agent(effect, policy)
        self.assertEqual(got, ({"ok": 3}, idem.Outcome.SKIPPED))
        self.assertEqual(len(self.attempts), 3)

    def test_a_permanent_error_is_committed_at_once_and_raised_on_every_replay(self):
        effect = self.flaky(9, permanent=True)
        for _ in range(2):
            with self.assertRaises(idem.EffectFailed) as caught:
                self.run_agent(effect, idem.RetryPolicy())
            self.assertEqual(caught.exception.message, "refused 1 (permanent, at attempt 1)")
            self.assertEqual(
                str(caught.exception), "side effect failed: refused 1 (permanent, at attempt 1)"
            )
        self.assertEqual(self.attempts, [(1, 0)])
        self.assertEqual(self.host.sleeps, {})
        self.assertEqual(self.committed("pay"), b'{"Err":"refused 1 (permanent, at attempt 1)"}')

    def test_the_last_attempts_error_is_committed_when_the_attempts_are_spent(self):
        effect = self.flaky(9)
        policy = idem.RetryPolicy(max_attempts=2, initial_delay=0.5, jitter=True)
        self.assertIsInstance(self.run_agent(effect, policy), InstanceEnded)
        (due,) = self.host.sleeps.values()
        self.assertTrue(250 <= due <= 500, due)
        self.host.now_ms = due
        with self.assertRaisesRegex(idem.EffectFailed, r"flaky 2 \(gave up after attempt 2\)$"):
            self.run_agent(effect, policy)
        self.assertEqual(self.committed("pay"), b'{"Err":"flaky 2 (gave up after attempt 2)"}')
        with self.assertRaises(idem.EffectFailed):
            self.run_agent(effect, policy)
        self.assertEqual(len(self.attempts), 2)

    def test_one_attempt_means_no_retry(self):
        effect = self.flaky(1)
        for attempts in (1, 0):
            self.host.keys.clear()
            with self.subTest(attempts), self.assertRaises(idem.EffectFailed):
                self.run_agent(effect, idem.RetryPolicy(max_attempts=attempts))
        self.assertEqual(self.host.sleeps, {})

    def test_any_other_exception_releases_and_propagates_uncommitted(self):
        def bug(step):
            raise TypeError("a bug, not a failure")

        with self.assertRaises(TypeError):
            self.run_agent(bug, idem.RetryPolicy())
        self.assertIsNone(self.committed("pay"))
        self.assertIsNone(self.host.keys["pay"].holder)
        self.assertEqual(self.host.sleeps, {})

    def test_a_claim_taken_over_answers_with_the_takers_commit(self):
        self.host.before_commit = lambda key: self.host.take_over(key, b'{"Ok":"theirs"}')
        got = self.run_agent(lambda _: "mine", idem.RetryPolicy())
        self.assertEqual(got, ("theirs", idem.Outcome.SKIPPED))

    def test_a_key_committed_by_run_once_is_not_a_retry_result(self):
        idem.run_once("pay", lambda _: {"plain": True})
        with self.assertRaisesRegex(idem.CodecError, "not a run_once_retry result"):
            idem.run_once_retry("pay", lambda _: None)

    def test_in_doubt_success_is_reclaimed_and_type_decodes_the_committed_value(self):
        from dataclasses import dataclass

        @dataclass
        class Receipt:
            id: str

        self.host.resume(lambda: idem.run_once_retry("pay", self.host.crash))
        got = idem.run_once_retry("pay", lambda step: Receipt(f"r{step.attempt}"), type=Receipt)
        self.assertEqual(got, (Receipt("r2"), idem.Outcome.RECLAIMED))
        self.assertEqual(self.committed("pay"), b'{"Ok":{"id":"r2"}}')
        got = idem.run_once_retry("pay", lambda _: None, type=Receipt)
        self.assertEqual(got, (Receipt("r2"), idem.Outcome.SKIPPED))

    def test_a_fingerprint_binds_the_key(self):
        idem.run_once_retry("pay", lambda _: 1, fingerprint={"cents": 5})
        with self.assertRaises(idem.KeyReused):
            idem.run_once_retry("pay", lambda _: 1, fingerprint={"cents": 6})

    def test_a_refused_backoff_sleep_is_the_wait_error(self):
        self.host.refuse["sleep"] = waits.WaitError_InvalidTime("too far")
        with self.assertRaisesRegex(idem.InvalidTime, "too far"):
            self.run_agent(self.flaky(1), idem.RetryPolicy())

    def test_a_refused_claim_is_the_step_error(self):
        self.host.refuse["run_once"] = types.StepError_InvalidKey("empty")
        with self.assertRaises(idem.InvalidKey):
            idem.run_once_retry("", lambda _: None)


if __name__ == "__main__":
    unittest.main()
