"""``idem.http`` against the fake host's ``wasi:http``: how a request is built (method,
URL parts, headers, length, JSON, body writes, timeouts), how the response is read,
how a refusal maps to ``HttpDenied``; and the key and token the host stamps on a
request made inside ``run_once``, under the names ``set_header_names`` chose."""

import json
import unittest

from fakehost import FakeIncomingBody, HostTestCase, http_types, idem


class Http(HostTestCase):
    def setUp(self):
        super().setUp()
        self.host.http_outside_claims = True
        self.host.server = lambda req: (200, [("content-type", b"text/plain")], b"ok")

    def only(self):
        self.assertEqual(len(self.host.requests), 1)
        return self.host.requests[0]

    def test_a_get_is_split_into_scheme_authority_and_path(self):
        r = idem.http.get("https://api.example.com:8443/v1/items?page=2#frag")
        req = self.only()
        self.assertEqual(req.method, http_types.Method_Get())
        self.assertEqual(req.scheme, http_types.Scheme_Https())
        self.assertEqual((req.authority, req.path), ("api.example.com:8443", "/v1/items?page=2"))
        self.assertEqual(req.headers, [], "a GET without a body says no length")
        self.assertEqual((r.status, r.ok, r.text), (200, True, "ok"))

    def test_a_url_without_a_path_asks_for_the_root(self):
        idem.http.delete("HTTP://example.com")
        req = self.only()
        self.assertEqual(req.method, http_types.Method_Delete())
        self.assertEqual(
            (req.scheme, req.authority, req.path), (http_types.Scheme_Http(), "example.com", "/")
        )

    def test_json_is_compact_utf8_with_its_type_and_length(self):
        idem.http.post("http://h/", json={"name": "café", "n": [1, 2]})
        req = self.only()
        body = json.dumps(
            {"name": "café", "n": [1, 2]}, separators=(",", ":"), ensure_ascii=False
        ).encode()
        self.assertEqual(req.body, body)
        self.assertEqual(req.header("content-type"), "application/json")
        self.assertEqual(req.header("content-length"), str(len(body)))

    def test_headers_are_lower_cased_and_a_given_length_is_replaced(self):
        idem.http.put(
            "http://h/x",
            headers={"X-Trace": "t-1", "Content-Type": "text/csv", "Content-Length": "999"},
            body="a,b\n",
        )
        req = self.only()
        self.assertEqual(
            req.headers,
            [("x-trace", b"t-1"), ("content-type", b"text/csv"), ("content-length", b"4")],
        )
        self.assertEqual(req.body, b"a,b\n")

    def test_an_empty_post_still_says_its_length(self):
        idem.http.post("http://h/")
        self.assertEqual(self.only().header("content-length"), "0")

    def test_a_large_body_goes_out_in_writes_of_at_most_4096_bytes(self):
        data = bytes(range(256)) * 40
        idem.http.request("PATCH", "http://h/blob", body=data, headers=[("x-a", "1")])
        req = self.only()
        self.assertEqual(req.method, http_types.Method_Patch())
        self.assertEqual(req.body, data)
        self.assertEqual(req.writes, [4096, 4096, 2048])

    def test_an_unknown_method_is_sent_as_other(self):
        idem.http.request("purge", "http://h/")
        self.assertEqual(self.only().method, http_types.Method_Other("PURGE"))
        with self.assertRaisesRegex(idem.HttpError, "method of http://h/ refused"):
            idem.http.request("NOT A METHOD", "http://h/")

    def test_a_timeout_sets_the_timeouts_the_host_offers(self):
        idem.http.get("http://h/", timeout=2.5)
        self.assertEqual(
            self.only().options, {"connect": 2_500_000_000, "first_byte": 2_500_000_000}
        )

    def test_the_response_is_read_to_its_end(self):
        body = b"x" * 23
        self.host.server = lambda req: (503, [("Retry-After", b"7"), ("X-Bin", b"\xff")], body)
        r = idem.http.get("http://h/")
        self.assertEqual((r.status, r.ok, r.body), (503, False, body))
        self.assertEqual(r.header("retry-after"), "7")
        self.assertEqual(r.header("RETRY-AFTER"), "7")
        self.assertIsNone(r.header("x-bin"), "not UTF-8")
        self.assertIsNone(r.header("missing"))
        self.assertEqual(r.headers[0], ("retry-after", b"7"))
        self.assertGreater(len(body), FakeIncomingBody.chunk, "several reads were needed")

    def test_json_responses_decode(self):
        self.host.server = lambda req: (201, [], b'{"id": 5}')
        self.assertEqual(idem.http.post("http://h/", json={}).json(), {"id": 5})

    def test_bad_urls_and_headers_are_http_errors_before_anything_is_sent(self):
        for url in ("ftp://h/", "h/path", "http:///path"):
            with self.subTest(url), self.assertRaisesRegex(idem.HttpError, "bad URL"):
                idem.http.get(url)
        with self.assertRaisesRegex(idem.HttpError, "headers of http://h/ cannot be sent"):
            idem.http.get("http://h/", headers={"bad name": "x"})
        self.assertEqual(self.host.requests, [])

    def test_a_refused_request_is_http_denied_naming_the_destination(self):
        self.host.http_outside_claims = False
        with self.assertRaises(idem.HttpDenied) as caught:
            idem.http.get("https://pay.example.com/charges")
        self.assertIsInstance(caught.exception, idem.HttpError)
        # The host's own words, naming the one cause.
        self.assertEqual(
            str(caught.exception),
            "HTTP request to pay.example.com denied: it was made outside any run-once claim, "
            "and the run's policy keeps side effects inside claims",
        )
        self.assertEqual(self.host.requests, [])

    def test_a_failed_exchange_is_an_http_error_naming_the_url(self):
        self.host.server = lambda req: http_types.ErrorCode_ConnectionRefused()
        with self.assertRaisesRegex(idem.HttpError, "HTTP request to http://h:81/ failed"):
            idem.http.get("http://h:81/")

    def test_inside_run_once_the_host_stamps_the_steps_key_and_token(self):
        self.host.http_outside_claims = False
        value, _ = idem.run_once("charge-17", lambda step: idem.http.post("http://h/").status)
        self.assertEqual(value, 200)
        req = self.only()
        self.assertEqual(req.header("idempotency-key"), "charge-17")
        self.assertEqual(req.header("idempotency-token"), "1")

        idem.http.set_header_names("X-Request-Key", "X-Fence")
        idem.run_once("charge-18", lambda step: idem.http.post("http://h/").status)
        last = self.host.requests[-1]
        self.assertEqual((last.header("x-request-key"), last.header("x-fence")), ("charge-18", "1"))
        self.assertIsNone(last.header("idempotency-key"))

    def test_refused_header_names_are_an_http_error(self):
        with self.assertRaisesRegex(idem.HttpError, "header names refused"):
            idem.http.set_header_names("host", "x-fence")


if __name__ == "__main__":
    unittest.main()
