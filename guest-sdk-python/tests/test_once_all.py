"""``run_once_all`` and ``http.send_all`` against the fake host: keys claimed together,
each step committed (or released) on its own, committed keys skipped, steps retaken in
doubt after a crash, the claims limit, and each request in flight under its own step's
key and token."""

import json
import unittest

from fakehost import HostTestCase, InstanceEnded, idem


class RunOnceAll(HostTestCase):
    def test_every_key_is_claimed_in_one_call_and_committed_on_its_own(self):
        seen = []

        def effects(steps):
            seen.append(steps)
            return [f"did {s.key}" for s in steps]

        got = idem.run_once_all(["a", "b", "c"], effects)
        self.assertEqual(got, [(f"did {k}", idem.Outcome.EXECUTED) for k in ("a", "b", "c")])
        self.assertEqual([c[0] for c in self.host.calls].count("run_once_many"), 1)
        self.assertEqual([s.key for s in seen[0]], ["a", "b", "c"])
        for k in ("a", "b", "c"):
            self.assertEqual(self.committed(k), json.dumps(f"did {k}").encode())

        again = idem.run_once_all(["a", "b", "c"], effects)
        self.assertEqual([o for _, o in again], [idem.Outcome.SKIPPED] * 3)
        self.assertEqual(len(seen), 1, "committed keys never run again")

    def test_only_the_keys_not_committed_run(self):
        idem.run_once("b", lambda step: "before")
        got = idem.run_once_all(["a", "b", "c"], lambda steps: [s.key for s in steps])
        self.assertEqual(
            got,
            [
                ("a", idem.Outcome.EXECUTED),
                ("before", idem.Outcome.SKIPPED),
                ("c", idem.Outcome.EXECUTED),
            ],
        )

    def test_a_failed_step_is_released_the_others_committed_and_its_error_raised(self):
        def effects(steps):
            return [ValueError(s.key) if s.key == "b" else s.key for s in steps]

        with self.assertRaisesRegex(ValueError, "^b$"):
            idem.run_once_all(["a", "b", "c"], effects)
        self.assertEqual(self.committed("a"), b'"a"')
        self.assertIsNone(self.committed("b"))
        self.assertIn(("release", "b"), self.host.calls)
        self.assertEqual(self.committed("c"), b'"c"')
        # The next call runs only the failed one, at its second attempt.
        got = idem.run_once_all(["a", "b", "c"], lambda steps: [s.attempt for s in steps])
        self.assertEqual([v for v, _ in got], ["a", 2, "c"])

    def test_an_exception_from_the_effects_releases_every_claim(self):
        def effects(steps):
            raise RuntimeError("all failed")

        with self.assertRaisesRegex(RuntimeError, "all failed"):
            idem.run_once_all(["a", "b"], effects)
        self.assertIn(("release", "a"), self.host.calls)
        self.assertIn(("release", "b"), self.host.calls)
        self.assertIsNone(self.host.held())

    def test_a_wrong_number_of_results_releases_every_claim(self):
        with self.assertRaisesRegex(idem.IdemError, "returned 1 results for 2 steps"):
            idem.run_once_all(["a", "b"], lambda steps: ["only one"])
        self.assertIsNone(self.host.held())

    def test_more_keys_than_the_claims_limit_are_refused_claiming_nothing(self):
        self.host.max_claims = 2
        with self.assertRaisesRegex(idem.TooLarge, "over the limit of 2"):
            idem.run_once_all(["a", "b", "c"], lambda steps: [1] * len(steps))
        self.assertEqual(self.host.keys, {}, "no key was claimed")
        got = idem.run_once_all(["a", "b"], lambda steps: [1] * len(steps))
        self.assertEqual(len(got), 2)

    def test_after_a_crash_committed_keys_skip_and_in_flight_ones_are_retaken_in_doubt(self):
        def crash_after_first_commit(key):
            if key == "b":
                self.host.crash()

        self.host.before_commit = crash_after_first_commit
        ended = self.host.resume(
            lambda: idem.run_once_all(["a", "b", "c"], lambda steps: [s.key for s in steps])
        )
        self.assertIsInstance(ended, InstanceEnded)
        self.host.before_commit = None
        seen = []

        def effects(steps):
            seen.extend(steps)
            return [s.key for s in steps]

        got = self.host.resume(lambda: idem.run_once_all(["a", "b", "c"], effects))
        self.assertEqual(
            [o for _, o in got],
            [idem.Outcome.SKIPPED, idem.Outcome.RECLAIMED, idem.Outcome.RECLAIMED],
        )
        self.assertEqual(
            [(s.key, s.attempt, s.token, s.in_doubt) for s in seen],
            [("b", 2, 2, True), ("c", 2, 2, True)],
        )


class SendAll(HostTestCase):
    def setUp(self):
        super().setUp()
        self.host.server = lambda req: (200, [], f"reply {req.path}".encode())

    def test_each_request_carries_its_own_step_and_all_are_in_flight_together(self):
        def effects(steps):
            responses = idem.http.send_all(
                idem.http.Request("POST", f"http://h/{s.key}", body=s.key, under=s) for s in steps
            )
            return [r.text if isinstance(r, idem.http.Response) else str(r) for r in responses]

        got = idem.run_once_all(["a", "b", "c"], effects)
        self.assertEqual([v for v, _ in got], ["reply /a", "reply /b", "reply /c"])
        for req, key in zip(self.host.requests, ("a", "b", "c"), strict=True):
            self.assertEqual(req.path, f"/{key}")
            self.assertEqual(req.header("idempotency-key"), key)
            self.assertEqual(req.header("idempotency-token"), "1")
            self.assertEqual(req.body, key.encode())
        kinds = [kind for kind, _ in self.host.events]
        self.assertEqual(kinds, ["handle"] * 3 + ["response"] * 3, "sent before any answer")

    def test_a_request_tied_to_a_settled_step_is_denied(self):
        stale = []
        idem.run_once_all(["a", "b"], lambda steps: stale.extend(steps) or [1, 2])
        idem.run_once("c", lambda step: 0)
        with idem.once("d") as step:
            [result] = idem.http.send_all([idem.http.Request("GET", "http://h/", under=stale[0])])
            step.commit(0)
        # The tie names a step whose claim is held no more: not sent under another.
        self.assertIsInstance(result, idem.HttpError)
        self.assertEqual(self.host.requests, [])

    def test_errors_come_back_in_place(self):
        self.host.http_outside_claims = True
        got = idem.http.send_all(
            [idem.http.Request("GET", "http://h/ok"), idem.http.Request("GET", "nope")]
        )
        self.assertIsInstance(got[0], idem.http.Response)
        self.assertIsInstance(got[1], idem.HttpError)
        self.assertIn("bad URL", str(got[1]))


if __name__ == "__main__":
    unittest.main()
