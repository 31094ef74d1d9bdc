"""The shared key vectors of ``wit/keys.md``, checked on CPython: the key code of the
SDK is pure Python, so it runs here as it runs inside the component."""

import json
import unittest

from fakehost import SRC, idem

keys = idem._keys
_json = idem._json
errors = idem._errors
VECTORS = SRC / "idem" / "wit" / "key-vectors.json"


class KeyVectors(unittest.TestCase):
    def test_the_shared_vectors_hold(self):
        data = json.loads(VECTORS.read_text(encoding="utf-8"))
        self.assertGreaterEqual(len(data["vectors"]), 10)
        for v in data["vectors"]:
            with self.subTest(v["note"]):
                self.assertEqual(_json.dumps(v["content"], "c").decode(), v["json"])
                shared = keys.Key.shared(v["step"], v["content"])
                self.assertEqual(shared.text, v["shared"])
                self.assertEqual(f"{data['run_id']}/{shared.text}", v["for_run"])
                self.assertEqual(
                    keys.Key("k").with_input(v["content"]).fingerprint, v["fingerprint"]
                )

    def test_tuples_and_dataclasses_encode_as_rust_does(self):
        from dataclasses import dataclass

        @dataclass
        class Charge:
            to: str
            amount: int

        self.assertEqual(
            keys.Key.shared("step", (1, "a")).text, "step/2010945388e2de98f5651051478912aa"
        )
        self.assertEqual(_json.dumps(Charge("alice", 300), "c"), b'{"to":"alice","amount":300}')

    def test_unencodable_content_is_a_codec_error(self):
        for bad in (float("nan"), object(), {1j: 2}):
            with self.assertRaises(errors.CodecError):
                keys.Key.shared("s", bad)


if __name__ == "__main__":
    unittest.main()
