"""``@idem.agent`` and the JSON codec: the export componentize-py calls, input decoded
into a dataclass, output and committed values encoded as serde encodes a Rust struct,
and every failure turned into the run's error (type, text, traceback), never a trap."""

from __future__ import annotations

import sys
import types as pytypes
import unittest
from dataclasses import dataclass, field

from fakehost import Err, HostTestCase, idem

_json = idem._json


@dataclass
class Item:
    name: str
    cents: int


@dataclass
class Order:
    id: str
    items: list[Item] = field(default_factory=list)
    note: str | None = None


class Codec(unittest.TestCase):
    def test_dataclasses_encode_in_field_order_nested_in_lists_and_dicts(self):
        order = Order("o-1", [Item("pear", 120)], None)
        self.assertEqual(
            _json.dumps({"order": order, "pair": (1, "é")}, "v"),
            '{"order":{"id":"o-1","items":[{"name":"pear","cents":120}],"note":null},'
            '"pair":[1,"é"]}'.encode(),
        )

    def test_unencodable_values_are_codec_errors_naming_what(self):
        for bad in (float("inf"), {1, 2}, b"bytes", Item):
            with self.subTest(bad), self.assertRaisesRegex(idem.CodecError, r"^JSON: output: "):
                _json.dumps(bad, "output")

    def test_decoding_builds_a_dataclass_only_when_asked(self):
        raw = _json.loads(b'{"name":"pear","cents":120}', "input")
        self.assertEqual(_json.build(None, raw, "input"), {"name": "pear", "cents": 120})
        self.assertEqual(_json.build(Item, raw, "input"), Item("pear", 120))
        self.assertEqual(_json.build(dict, raw, "input"), raw, "not a dataclass: as decoded")
        with self.assertRaisesRegex(idem.CodecError, "expected an object for Item"):
            _json.build(Item, [1, 2], "input")
        with self.assertRaisesRegex(idem.CodecError, "unexpected keyword argument 'weight'"):
            _json.build(Item, {"name": "x", "cents": 1, "weight": 2}, "input")
        with self.assertRaises(idem.CodecError):
            _json.loads(b"{not json", "input")


class Agent(HostTestCase):
    def export(self, fn):
        """Decorates ``fn`` as an app module's agent; returns the module's export."""
        module = pytypes.ModuleType("app_under_test")
        sys.modules[module.__name__] = module
        self.addCleanup(sys.modules.pop, module.__name__, None)
        fn.__module__ = module.__name__
        self.assertIs(idem.agent(fn), fn)
        return module.WitWorld()

    def test_input_is_decoded_into_the_annotated_dataclass_and_output_encoded(self):
        def run(order: Order) -> Item:
            self.assertIsInstance(order, Order)
            return Item(order.id, len(order.items))

        world = self.export(run)
        out = world.run(b'{"id":"o-9","items":[],"note":"x"}')
        self.assertEqual(out, b'{"name":"o-9","cents":0}')

    def test_a_string_annotation_is_resolved_in_the_functions_module(self):
        def run(order: Order) -> None:
            self.assertIsInstance(order, Order)

        run.__annotations__["order"] = "Order"
        self.assertEqual(self.export(run).run(b'{"id":"o"}'), b"null")

    def test_an_unannotated_agent_gets_plain_json(self):
        self.assertEqual(self.export(lambda input: input["n"] + 1).run(b'{"n":41}'), b"42")

    def test_an_exception_fails_the_run_with_its_type_text_and_traceback(self):
        def run(input):
            raise ValueError(f"no items in {input}")

        with self.assertRaises(Err) as caught:
            self.export(run).run(b"[]")
        text = caught.exception.value
        self.assertTrue(text.startswith("ValueError: no items in []\n\nTraceback"), text)
        self.assertIn("in run", text)

    def test_bad_input_and_unencodable_output_fail_the_run_as_codec_errors(self):
        with self.assertRaises(Err) as caught:
            self.export(lambda order: order).run(b"\xff")
        self.assertTrue(caught.exception.value.startswith("CodecError: JSON: input: "))

        def run(order: Order):
            return order

        with self.assertRaises(Err) as caught:
            self.export(run).run(b"[1]")
        self.assertTrue(caught.exception.value.startswith("CodecError: JSON: input: expected"))
        with self.assertRaises(Err) as caught:
            self.export(lambda _: object()).run(b"{}")
        self.assertTrue(caught.exception.value.startswith("CodecError: JSON: output: "))

    def test_run_id_and_generation_come_from_the_host(self):
        self.host.run_id, self.host.generation = "r-7", 3
        self.assertEqual((idem.run_id(), idem.generation()), ("r-7", 3))


if __name__ == "__main__":
    unittest.main()
