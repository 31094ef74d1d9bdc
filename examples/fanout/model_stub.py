"""A stand-in for a model endpoint, for the fanout example and scripts/demo.

Listens on 127.0.0.1 (the port is written to the file given as the first argument),
answers ``POST /summarize``, ``/title`` and ``/tags`` after a short pause with a text
made from the request's body, and appends one line per request to the file given as
the second argument: the path, the ``Idempotency-Key`` and the ``Idempotency-Token``
the host stamped on it. Counting the keys in that file shows each call made once.
"""

import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PAUSE_S = 0.3
lock = threading.Lock()


class Model(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
        length = int(self.headers.get("content-length", "0"))
        text = self.rfile.read(length).decode("utf-8", "replace")
        key = self.headers.get("idempotency-key", "-")
        token = self.headers.get("idempotency-token", "-")
        with lock, open(sys.argv[2], "a", encoding="utf-8") as log:
            log.write(f"{self.path} {key} {token}\n")
        time.sleep(PAUSE_S)
        words = text.split()
        if self.path == "/summarize":
            answer = " ".join(words[:4]) + "..."
        elif self.path == "/title":
            answer = f"Digest of {len(text.splitlines())} documents"
        else:
            answer = ", ".join(sorted({w.lower().strip(".,") for w in words if len(w) > 6})[:3])
        body = answer.encode()
        try:
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            # The worker that asked was killed while it waited: its claim is retaken,
            # in doubt, and the call made again under the same key.
            pass

    def log_message(self, *args: object) -> None:
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Model)
with open(sys.argv[1], "w", encoding="utf-8") as port_file:
    port_file.write(str(server.server_address[1]))
server.serve_forever()
