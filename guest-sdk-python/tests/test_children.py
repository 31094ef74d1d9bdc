"""Child runs against the fake host: what ``spawn`` and the joins ask the host, how a
join that is not over ends the instance and a replay finds it over, a parent resumed
after a crash spawning nothing twice, the outcomes, and the host's refusals as the
SDK's exceptions."""

import json
import unittest

from fakehost import HostTestCase, InstanceEnded, children, idem

COMPLETED = children.ChildStatus.COMPLETED
FAILED = children.ChildStatus.FAILED
CANCELLED = children.ChildStatus.CANCELLED


class Spawn(HostTestCase):
    def setUp(self):
        super().setUp()
        self.host.deployments.add("fetcher")

    def spawns(self):
        return [c[1:] for c in self.host.calls if c[0] == "spawn"]

    def test_a_spawn_sends_the_input_as_json_and_returns_the_child(self):
        child = idem.spawn("item-0", "fetcher", {"url": "http://x", "steps": 1})
        self.assertEqual(child, idem.Child(self.host.child_id("item-0")))
        self.assertEqual(child.run_id, "run-1~item-0")
        detached = idem.spawn("item-1", "fetcher", [1, 2], detached=True)
        self.assertEqual(
            self.spawns(),
            [
                ("item-0", "fetcher", b'{"url":"http://x","steps":1}', False),
                ("item-1", "fetcher", b"[1,2]", True),
            ],
        )
        self.assertTrue(self.host.children[detached.run_id].detached)

    def test_spawn_many_answers_each_child_in_order_in_one_call(self):
        specs = [
            idem.ChildSpec("item-0", "fetcher", {"n": 0}),
            idem.ChildSpec("item-1", "nowhere", {"n": 1}),
            idem.ChildSpec("item-2", "fetcher", {"n": 2}, detached=True),
        ]
        answers = idem.spawn_many(specs)
        self.assertEqual(answers[0], idem.Child(self.host.child_id("item-0")))
        self.assertIsInstance(answers[1], idem.UnknownDeployment)
        self.assertIn("nowhere", str(answers[1]))
        self.assertEqual(answers[2], idem.Child(self.host.child_id("item-2")))
        self.assertTrue(self.host.children[self.host.child_id("item-2")].detached)
        calls = [c for c in self.host.calls if c[0].startswith("spawn")]
        self.assertEqual(
            calls,
            [
                (
                    "spawn_many",
                    [
                        ("item-0", "fetcher", b'{"n":0}', False),
                        ("item-1", "nowhere", b'{"n":1}', False),
                        ("item-2", "fetcher", b'{"n":2}', True),
                    ],
                )
            ],
        )
        self.assertEqual(len(self.host.children), 2)

    def test_spawn_all_returns_the_children_or_raises_the_first_refusal(self):
        kids = idem.spawn_all("fetcher", [(f"item-{i}", {"n": i}) for i in range(3)])
        self.assertEqual([k.run_id for k in kids], [f"run-1~item-{i}" for i in range(3)])
        again = idem.spawn_all("fetcher", [(f"item-{i}", {"n": i}) for i in range(3)])
        self.assertEqual(again, kids)
        self.assertEqual(len(self.host.children), 3)
        with self.assertRaises(idem.SpawnKeyReused):
            idem.spawn_all("fetcher", [("item-3", 3), ("item-0", {"n": 99})])
        self.assertIn(self.host.child_id("item-3"), self.host.children)

    def test_spawning_again_under_a_key_returns_the_same_child_and_starts_none(self):
        first = idem.spawn("item-0", "fetcher", {"n": 1})
        again = idem.spawn("item-0", "fetcher", {"n": 1})
        self.assertEqual(first, again)
        self.assertEqual(len(self.host.children), 1)

    def test_input_that_is_not_json_is_refused_before_the_host_is_asked(self):
        with self.assertRaises(idem.CodecError) as caught:
            idem.spawn("item-0", "fetcher", {"when": object()})
        self.assertIn("child input", str(caught.exception))
        self.assertEqual(self.spawns(), [])

    def test_each_refusal_is_its_own_exception_with_the_hosts_detail(self):
        cases = [
            (children.SpawnError_InvalidKey("empty"), idem.InvalidSpawnKey),
            (children.SpawnError_UnknownDeployment("no such"), idem.UnknownDeployment),
            (children.SpawnError_KeyReused("other input"), idem.SpawnKeyReused),
            (children.SpawnError_TooLarge("2 MiB"), idem.SpawnTooLarge),
            (children.SpawnError_Limit("8 deep"), idem.SpawnLimit),
            (children.SpawnError_Cycle("for ever"), idem.SpawnCycle),
        ]
        for error, exc in cases:
            with self.subTest(exc.__name__):
                self.host.refuse["spawn"] = error
                with self.assertRaises(exc) as caught:
                    idem.spawn("k", "fetcher", None)
                self.assertIsInstance(caught.exception, idem.SpawnError)
                self.assertIsInstance(caught.exception, idem.IdemError)
                self.assertEqual(caught.exception.detail, error.value)
                self.assertTrue(str(caught.exception).endswith(f": {error.value}"))
        self.assertEqual(self.host.children, {})

    def test_the_fake_hosts_own_refusals_reach_the_agent_typed(self):
        with self.assertRaisesRegex(idem.UnknownDeployment, 'no deployment is called "nobody"'):
            idem.spawn("k", "nobody", None)
        idem.spawn("k", "fetcher", {"n": 1})
        with self.assertRaises(idem.SpawnKeyReused):
            idem.spawn("k", "fetcher", {"n": 2})
        with self.assertRaisesRegex(idem.InvalidSpawnKey, "^invalid spawn key: "):
            idem.spawn("", "fetcher", None)
        self.host.max_children = 1
        with self.assertRaisesRegex(idem.SpawnLimit, "spawned 1 children, the limit"):
            idem.spawn("k2", "fetcher", None)
        self.assertEqual(list(self.host.children), ["run-1~k"])


class Join(HostTestCase):
    def setUp(self):
        super().setUp()
        self.host.deployments.add("fetcher")

    def three(self):
        return [idem.spawn(f"item-{i}", "fetcher", {"i": i}) for i in range(3)]

    def test_join_all_ends_the_instance_until_every_child_has_ended(self):
        kids = self.three()
        self.assertIsInstance(self.host.resume(lambda: idem.join_all("all", kids)), InstanceEnded)
        self.host.finish("item-2", COMPLETED, b'{"ok":2}')
        self.host.finish("item-0", FAILED, b"boom: \xff")
        self.assertIsInstance(self.host.resume(lambda: idem.join_all("all", kids)), InstanceEnded)
        self.host.finish("item-1", CANCELLED)
        outcomes = self.host.resume(lambda: idem.join_all("all", kids))
        self.assertEqual(
            outcomes,
            [
                idem.ChildOutcome.Failed("boom: \ufffd"),
                idem.ChildOutcome.Cancelled(),
                idem.ChildOutcome.Completed({"ok": 2}),
            ],
            "in the order of the list, not of their ends",
        )
        self.assertEqual(
            [c[1:] for c in self.host.calls if c[0] == "join_all"],
            [("all", [k.run_id for k in kids], None)] * 3,
        )

    def test_a_join_reached_again_answers_the_same(self):
        kids = self.three()
        for i in range(3):
            self.host.finish(f"item-{i}", COMPLETED, json.dumps(i).encode())
        first = idem.join_all("all", kids)
        self.assertEqual(first, [idem.ChildOutcome.Completed(i) for i in range(3)])
        self.assertEqual(idem.join_all("all", kids), first)
        self.assertEqual(len(self.host.joins), 1)

    def test_join_any_answers_the_first_child_to_end_with_its_place(self):
        kids = self.three()
        self.assertIsInstance(self.host.resume(lambda: idem.join_any("any", kids)), InstanceEnded)
        self.host.finish("item-1", COMPLETED, b'"one"')
        self.host.finish("item-0", COMPLETED, b'"zero"')
        answer = idem.join_any("any", kids)
        self.assertEqual(answer, (1, idem.ChildOutcome.Completed("one")))
        self.assertEqual(idem.join_any("any", kids), answer)

    def test_join_of_one_child_is_recorded_under_its_own_key(self):
        (child, *_) = self.three()
        self.host.finish("item-0", COMPLETED, b"null")
        self.assertEqual(idem.join(child), idem.ChildOutcome.Completed(None))
        self.assertEqual(list(self.host.joins), [f"join-{child.run_id}"])

    def test_a_timeout_in_seconds_reaches_the_host_in_milliseconds_and_is_recorded(self):
        kids = self.three()
        ended = self.host.resume(lambda: idem.join_all("all", kids, timeout=1.5))
        self.assertIsInstance(ended, InstanceEnded)
        self.assertEqual(self.host.calls[-1], ("join_all", "all", [k.run_id for k in kids], 1500))
        self.host.now_ms = 1500
        with self.assertRaises(idem.JoinTimedOut) as caught:
            idem.join_all("all", kids, timeout=1.5)
        self.assertEqual(caught.exception.key, "all")
        self.assertEqual(str(caught.exception), "timed out joining children under key 'all'")
        with self.assertRaises(idem.JoinTimedOut):
            idem.join_any("first", kids, timeout=0)
        # The children ending later changes nothing: the timeouts were recorded.
        for i in range(3):
            self.host.finish(f"item-{i}", COMPLETED, b"1")
        with self.assertRaises(idem.JoinTimedOut):
            idem.join_all("all", kids, timeout=1.5)
        with self.assertRaises(idem.JoinTimedOut):
            idem.join_any("first", kids, timeout=0)

    def test_bad_timeouts_and_lists_are_refused_before_the_host_is_asked(self):
        kids = self.three()
        for bad, exc in ((-1, ValueError), (float("nan"), ValueError), ("5", TypeError)):
            with self.subTest(bad), self.assertRaises(exc):
                idem.join_all("all", kids, timeout=bad)
        with self.assertRaisesRegex(TypeError, "got str"):
            idem.join_all("all", [kids[0].run_id])
        with self.assertRaisesRegex(TypeError, "sequence of children"):
            idem.join_all("all", kids[0])
        with self.assertRaisesRegex(TypeError, "got str"):
            idem.join(kids[0].run_id)
        self.assertFalse([c for c in self.host.calls if c[0].startswith("join")])

    def test_each_refusal_is_its_own_exception_with_the_hosts_detail(self):
        kids = self.three()
        cases = [
            (children.JoinError_InvalidKey("empty"), idem.InvalidJoinKey, "invalid join key"),
            (children.JoinError_InvalidChildren("twice"), idem.InvalidChildren, "join refused"),
            (children.JoinError_KeyReused("a sleep"), idem.JoinKeyReused, "join refused"),
            (children.JoinError_InvalidTime("too far"), idem.InvalidJoinTime, "join refused"),
            (
                children.JoinError_ClaimsHeld('"k"'),
                idem.JoinClaimsHeld,
                "cannot join while holding claims",
            ),
        ]
        for error, exc, prefix in cases:
            for join in (idem.join_all, idem.join_any):
                with self.subTest(exc.__name__, join=join.__name__):
                    self.host.refuse["join"] = error
                    with self.assertRaises(exc) as caught:
                        join("all", kids)
                    self.assertIsInstance(caught.exception, idem.JoinError)
                    self.assertEqual(str(caught.exception), f"{prefix}: {error.value}")
        self.host.refuse["join"] = children.JoinError_NotAChild("stranger")
        with self.assertRaises(idem.NotAChild) as caught:
            idem.join_all("all", kids)
        self.assertEqual(caught.exception.run_id, "stranger")
        self.assertEqual(
            str(caught.exception), 'join refused: run "stranger" is not a child of this run'
        )
        self.assertEqual(self.host.joins, {})

    def test_the_fake_hosts_own_refusals_reach_the_agent_typed(self):
        kids = self.three()
        with self.assertRaises(idem.NotAChild):
            idem.join_all("all", [*kids, idem.Child("someone-else")])
        with self.assertRaises(idem.InvalidChildren):
            idem.join_all("all", [kids[0], kids[0]])
        with self.assertRaises(idem.InvalidChildren):
            idem.join_any("all", [])
        with idem.once("charge") as step:
            with self.assertRaises(idem.JoinClaimsHeld):
                idem.join_all("all", kids)
            step.commit(None)
        self.host.finish("item-0", COMPLETED, b"0")
        idem.join_any("first", kids)
        with self.assertRaises(idem.JoinKeyReused):
            idem.join_all("first", kids)

    def test_output_that_is_not_json_fails_naming_the_child(self):
        (child, *_) = self.three()
        self.host.finish("item-0", COMPLETED, b"{not json")
        with self.assertRaisesRegex(idem.CodecError, f"output of child {child.run_id}"):
            idem.join(child)


class Outcomes(unittest.TestCase):
    def test_result_is_the_value_or_child_failed_naming_the_child(self):
        child = idem.Child("p~abc")
        self.assertEqual(idem.ChildOutcome.Completed({"a": 1}).result(child), {"a": 1})
        with self.assertRaises(idem.ChildFailed) as caught:
            idem.ChildOutcome.Failed("no stock").result(child)
        self.assertEqual(str(caught.exception), "child p~abc failed: no stock")
        self.assertEqual((caught.exception.run_id, caught.exception.error), ("p~abc", "no stock"))
        with self.assertRaises(idem.ChildFailed) as caught:
            idem.ChildOutcome.Cancelled().result(child)
        self.assertEqual(str(caught.exception), "child p~abc was cancelled")
        self.assertIsNone(caught.exception.error)

    def test_outcomes_match_by_case(self):
        def what(outcome):
            match outcome:
                case idem.ChildOutcome.Completed(value):
                    return f"completed {value}"
                case idem.ChildOutcome.Failed(error):
                    return f"failed {error}"
                case idem.ChildOutcome.Cancelled():
                    return "cancelled"
            return "none"

        self.assertEqual(what(idem.ChildOutcome.Completed(3)), "completed 3")
        self.assertEqual(what(idem.ChildOutcome.Failed("x")), "failed x")
        self.assertEqual(what(idem.ChildOutcome.Cancelled()), "cancelled")
        self.assertNotEqual(idem.ChildOutcome.Completed(None), idem.ChildOutcome.Cancelled())


class ChildValue(HostTestCase):
    def test_a_child_is_its_run_id_in_a_checkpoint_and_comes_back_from_it(self):
        kids = [idem.Child("p~a"), idem.Child("p~b")]
        idem.save(1, kids)
        self.assertEqual(self.host.checkpoint.state, b'["p~a","p~b"]', "as the Rust SDK's")
        idem.save(2, {"children": kids, "left": (kids[1],)})
        self.assertEqual(self.host.checkpoint.state, b'{"children":["p~a","p~b"],"left":["p~b"]}')
        back = [idem.Child(run_id) for run_id in idem.load().state["children"]]
        self.assertEqual(back, kids)

    def test_a_child_is_a_value(self):
        child = idem.Child("p~a")
        self.assertEqual(child, idem.Child("p~a"))
        self.assertNotEqual(child, "p~a")
        self.assertEqual(len({child, idem.Child("p~a"), idem.Child("p~b")}), 2)
        self.assertEqual((repr(child), str(child)), ("Child('p~a')", "p~a"))
        with self.assertRaises(AttributeError):
            child.run_id = "other"
        with self.assertRaises(TypeError):
            idem.Child(17)


class Parent(HostTestCase):
    """A parent agent end to end, as the host runs it: crashed after its second spawn,
    resumed, suspended in its join, woken when its children have ended."""

    def test_a_resumed_parent_spawns_nothing_twice_and_joins_once(self):
        self.host.deployments.add("fetcher")
        crash_after = [2]

        def parent():
            kids = []
            for i in range(3):
                kids.append(idem.spawn(f"item-{i}", "fetcher", {"i": i}))
                if crash_after and len(kids) == crash_after[0]:
                    crash_after.clear()
                    self.host.crash()
            outcomes = idem.join_all("all", kids)
            return [o.result(k) for k, o in zip(kids, outcomes, strict=True)]

        self.assertIsInstance(self.host.resume(parent), InstanceEnded)
        self.assertEqual(len(self.host.children), 2)
        self.assertIsInstance(self.host.resume(parent), InstanceEnded)
        self.assertEqual(len(self.host.children), 3, "the first two were found, not respawned")
        for i in range(3):
            self.host.finish(f"item-{i}", COMPLETED, json.dumps({"body": i}).encode())
        self.assertEqual(self.host.resume(parent), [{"body": i} for i in range(3)])
        spawned = [c[1] for c in self.host.calls if c[0] == "spawn"]
        self.assertEqual(spawned, ["item-0", "item-1"] + ["item-0", "item-1", "item-2"] * 2)


if __name__ == "__main__":
    unittest.main()
