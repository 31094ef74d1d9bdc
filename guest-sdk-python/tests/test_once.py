"""``run_once``, ``with idem.once(...)`` and the checkpoint against the fake host: the
commit and release paths, the in-doubt policies, fingerprints, a claim taken over, and
the host's refusals as the SDK's exceptions."""

import json
import unittest

from fakehost import HostTestCase, InstanceEnded, idem, once, types


class RunOnce(HostTestCase):
    def test_the_first_call_runs_and_commits_later_calls_skip(self):
        seen = []

        def effect(step):
            seen.append(step)
            return {"sent": step.key}

        value, outcome = idem.run_once("k", effect)
        self.assertEqual((value, outcome), ({"sent": "k"}, idem.Outcome.EXECUTED))
        self.assertTrue(outcome.ran)
        self.assertEqual(seen, [idem.Step("k", 1, 1, False)])
        self.assertEqual(self.committed("k"), b'{"sent":"k"}')

        value, outcome = idem.run_once("k", effect)
        self.assertEqual((value, outcome), ({"sent": "k"}, idem.Outcome.SKIPPED))
        self.assertFalse(outcome.ran)
        self.assertEqual(len(seen), 1, "a committed key never runs its effect again")

    def test_an_exception_releases_the_claim_and_the_next_attempt_runs(self):
        def fails(step):
            raise RuntimeError(f"attempt {step.attempt} fails")

        with self.assertRaisesRegex(RuntimeError, "attempt 1 fails"):
            idem.run_once("k", fails)
        self.assertIn(("release", "k"), self.host.calls)
        self.assertIsNone(self.committed("k"))
        value, _ = idem.run_once("k", lambda step: step.attempt)
        self.assertEqual(value, 2)

    def test_an_unencodable_result_releases_the_claim(self):
        with self.assertRaises(idem.CodecError):
            idem.run_once("k", lambda _: float("nan"))
        self.assertIsNone(self.host.keys["k"].holder)
        self.assertIsNone(self.committed("k"))

    def test_a_fingerprint_binds_the_key_to_its_input(self):
        idem.run_once("charge", lambda _: 1, fingerprint={"cents": 100})
        fp = self.host.keys["charge"].fingerprint
        self.assertEqual(fp, idem.Key("charge").with_input({"cents": 100}).fingerprint)
        self.assertTrue(fp.startswith("sha256:"))
        _, outcome = idem.run_once("charge", lambda _: 2, fingerprint={"cents": 100})
        self.assertEqual(outcome, idem.Outcome.SKIPPED)
        with self.assertRaises(idem.KeyReused) as caught:
            idem.run_once("charge", lambda _: 3, fingerprint={"cents": 999})
        self.assertTrue(str(caught.exception).startswith("key reused with other input: "))

    def test_a_key_for_the_run_carries_the_run_id(self):
        key = idem.Key.for_run("send", "a")
        self.assertEqual(key.text, f"run-1/{idem.Key.shared('send', 'a').text}")
        idem.run_once(key, lambda step: step.key)
        self.assertIn(key.text, self.host.keys)

    def test_save_writes_the_checkpoint_in_the_commit_and_again_on_a_skip(self):
        idem.run_once("k", lambda _: 5, save=lambda v: (1, {"total": v}))
        commit = next(c for c in self.host.calls if c[0] == "commit")
        self.assertEqual((commit[3].step, commit[3].state), (1, b'{"total":5}'))
        self.assertEqual(self.host.saves, [(1, b'{"total":5}')])
        # Skipped (the commit carried the checkpoint in an instance that died before
        # the next step): the checkpoint is saved on its own.
        idem.run_once("k", lambda _: 6, save=(2, "again"))
        self.assertEqual(self.host.saves[-1], (2, b'"again"'))
        self.assertEqual(idem.load(), idem.Checkpoint(2, "again"))

    def test_the_in_doubt_policy_chooses_when_the_claim_is_made_durable(self):
        idem.run_once("a", lambda _: 1)
        idem.run_once("b", lambda _: 1, in_doubt=idem.FAIL)
        durability = {c[1]: c[3] for c in self.host.calls if c[0] == "run_once"}
        self.assertEqual(durability["a"], once.Durability.WITH_COMMIT)
        self.assertEqual(durability["b"], once.Durability.BEFORE_EFFECT)

    def test_a_claim_taken_over_during_the_effect_yields_the_takers_result(self):
        def takes_over(key):
            self.host.take_over(key, commit=b'"theirs"')

        self.host.before_commit = takes_over
        value, outcome = idem.run_once("k", lambda _: "mine", save=(3, None))
        self.assertEqual((value, outcome), ("theirs", idem.Outcome.AWAITED))
        self.assertEqual(self.host.saves, [(3, b"null")])

    def test_a_claim_taken_over_and_not_committed_is_claim_lost(self):
        self.host.before_commit = lambda key: self.host.take_over(key)
        with self.assertRaises(idem.ClaimLost):
            idem.run_once("k", lambda _: "mine")
        # The SDK claimed again to look for the taker's result, and gave that back.
        self.assertEqual(self.host.calls[-1], ("release", "k"))

    def test_type_decodes_a_committed_result_into_a_dataclass(self):
        from dataclasses import dataclass

        @dataclass
        class Receipt:
            id: str
            cents: int

        value, _ = idem.run_once("k", lambda _: Receipt("r-1", 250), type=Receipt)
        self.assertEqual(value, Receipt("r-1", 250))
        self.assertEqual(self.committed("k"), b'{"id":"r-1","cents":250}')
        value, outcome = idem.run_once("k", lambda _: None, type=Receipt)
        self.assertEqual((value, outcome), (Receipt("r-1", 250), idem.Outcome.SKIPPED))


class InDoubt(HostTestCase):
    def crash_inside(self, key):
        """An instance claims ``key`` and dies inside the effect."""

        ended = self.host.resume(lambda: idem.run_once(key, self.host.crash))
        self.assertIsInstance(ended, InstanceEnded)
        self.assertTrue(self.host.keys[key].in_doubt)

    def test_retry_runs_the_effect_again_reclaimed(self):
        self.crash_inside("k")
        value, outcome = idem.run_once("k", lambda step: (step.attempt, step.in_doubt))
        self.assertEqual(value, (2, True))
        self.assertEqual(outcome, idem.Outcome.RECLAIMED)
        self.assertTrue(outcome.ran)

    def test_fail_stops_the_run_in_doubt_without_running_the_effect(self):
        self.crash_inside("k")
        ran = []
        ended = self.host.resume(
            lambda: idem.run_once("k", lambda _: ran.append(1), in_doubt=idem.FAIL)
        )
        self.assertIsInstance(ended, InstanceEnded)
        self.assertEqual(ran, [])
        self.assertEqual(self.host.keys["k"].parked, "attempt 1 of k may have run already")
        with self.assertRaises(idem.InDoubt) as caught:
            idem.run_once("k", lambda _: None)
        self.assertTrue(str(caught.exception).startswith("in doubt, waiting for idem resolve: "))

    def test_a_probe_that_finds_the_effect_commits_its_value_without_running_it(self):
        self.crash_inside("k")
        ran = []

        def probe(step):
            self.assertEqual((step.attempt, step.in_doubt), (2, True))
            return True, "found"

        value, outcome = idem.run_once(
            "k", lambda _: ran.append(1), in_doubt=probe, save=(7, "state")
        )
        self.assertEqual((value, outcome), ("found", idem.Outcome.PROBED))
        self.assertEqual(ran, [])
        self.assertEqual(self.committed("k"), b'"found"')
        self.assertEqual(self.host.saves, [(7, b'"state"')], "saved once, with the commit")

    def test_a_probe_that_finds_nothing_runs_the_effect(self):
        self.crash_inside("k")
        value, outcome = idem.run_once("k", lambda _: "ran", in_doubt=lambda _: (False, None))
        self.assertEqual((value, outcome), ("ran", idem.Outcome.RECLAIMED))

    def test_a_failing_probe_releases_the_claim(self):
        self.crash_inside("k")

        def probe(step):
            raise OSError("log unreadable")

        with self.assertRaises(OSError):
            idem.run_once("k", lambda _: None, in_doubt=probe)
        self.assertIsNone(self.host.keys["k"].holder)

    def test_an_unknown_policy_is_refused_and_the_claim_released(self):
        self.crash_inside("k")
        with self.assertRaisesRegex(ValueError, "in_doubt must be"):
            idem.run_once("k", lambda _: None, in_doubt="sometimes")
        self.assertIsNone(self.host.keys["k"].holder)


class WithBlock(HostTestCase):
    def test_commit_inside_the_block(self):
        with idem.once("k") as step:
            self.assertFalse(step.done)
            self.assertEqual((step.attempt, step.token, step.in_doubt), (1, 1, False))
            step.commit({"n": 1}, save=(1, None))
        self.assertEqual((step.value, step.outcome), ({"n": 1}, idem.Outcome.EXECUTED))
        with self.assertRaises(idem.ClaimSettled):
            step.commit({"n": 2})
        with idem.once("k") as again:
            self.assertTrue(again.done)
            self.assertEqual(again.value, {"n": 1})
            with self.assertRaises(idem.ClaimSettled):
                _ = again.attempt

    def test_an_exception_in_the_block_releases_and_propagates(self):
        with self.assertRaises(KeyError), idem.once("k"):
            raise KeyError("boom")
        self.assertIn(("release", "k"), self.host.calls)
        self.assertIsNone(self.committed("k"))

    def test_a_block_without_commit_releases_and_raises(self):
        with self.assertRaisesRegex(idem.IdemError, "ended without step.commit"), idem.once("k"):
            pass
        self.assertIsNone(self.host.keys["k"].holder)


class Refusals(HostTestCase):
    def test_each_step_error_is_its_exception_with_the_hosts_detail(self):
        cases = [
            (types.StepError_InvalidKey, idem.InvalidKey, "invalid key"),
            (types.StepError_TooLarge, idem.TooLarge, "too large"),
            (types.StepError_ClaimLost, idem.ClaimLost, "claim lost"),
            (types.StepError_AwaitTimeout, idem.AwaitTimeout, "await timeout"),
            (types.StepError_InDoubt, idem.InDoubt, "in doubt, waiting for idem resolve"),
            (types.StepError_KeyReused, idem.KeyReused, "key reused with other input"),
        ]
        for case, cls, prefix in cases:
            with self.subTest(cls.__name__):
                self.host.refuse["run_once"] = case("the detail")
                with self.assertRaises(cls) as caught:
                    idem.run_once("k", lambda _: None)
                self.assertIsInstance(caught.exception, idem.StepError)
                self.assertEqual(str(caught.exception), f"{prefix}: the detail")
                self.assertEqual(caught.exception.detail, "the detail")

    def test_a_refused_commit_raises_and_leaves_nothing_committed(self):
        self.host.refuse["commit"] = types.StepError_TooLarge("result over 1 MiB")
        with self.assertRaises(idem.TooLarge):
            idem.run_once("k", lambda _: "x")
        self.assertIsNone(self.committed("k"))

    def test_a_refused_save_raises(self):
        self.host.refuse["save"] = types.StepError_TooLarge("state over 64 KiB")
        with self.assertRaisesRegex(idem.TooLarge, "state over 64 KiB"):
            idem.save(1, "x" * 10)

    def test_load_and_save_round_trip_json(self):
        self.assertIsNone(idem.load())
        idem.save(3, {"seen": ["a", "é"]})
        self.assertEqual(
            self.host.checkpoint.state,
            json.dumps({"seen": ["a", "é"]}, separators=(",", ":"), ensure_ascii=False).encode(),
        )
        self.assertEqual(idem.load(), idem.Checkpoint(3, {"seen": ["a", "é"]}))


if __name__ == "__main__":
    unittest.main()
