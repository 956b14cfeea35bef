"""A loopback fake OpenAI-compatible server for bench/faults.py and the backend tests: 20 failure modes.

The served model name picks the mode; the answer to a healthy request is `ans:<last user text>`, so a
written row can be checked exactly. `Evil` is where the redirect modes point: it records whether the
API key reached it and answers something that must never be kept.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# ---------------------------------------------------------------- 3. the fake OpenAI server
KEY = "sk-eyas-fault-harness-secret"


class FakeOpenAI(BaseHTTPRequestHandler):
    """Answers `ans:<last user text>`; the failure mode is the first word of the served model name."""
    protocol_version = "HTTP/1.1"
    seen: dict = {}
    evil_port = 0
    lock = threading.Lock()

    def log_message(self, *a):
        pass

    def _send(self, code, data: bytes, headers=(), length=None):
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data) if length is None else length))
        self.end_headers()
        self.wfile.write(data)

    def _ok(self, content, finish="stop"):
        return json.dumps({"choices": [{"message": {"role": "assistant", "content": content},
                                        "finish_reason": finish}]}).encode()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        mode, last = body["model"], body["messages"][-1]["content"]
        with self.lock:
            n = self.seen[(mode, last)] = self.seen.get((mode, last), 0) + 1
        answer = self._ok(f"ans:{last}")
        if mode == "slow":
            time.sleep(0.03)
            return self._send(200, answer)
        if mode == "ok":
            return self._send(200, answer)
        if mode == "503-once":
            return self._send(503, b"{}") if n == 1 else self._send(200, answer)
        if mode == "429-retry-after":
            return self._send(429, b"{}", [("Retry-After", "1")]) if n == 1 else self._send(200, answer)
        if mode == "500":
            return self._send(500, b'{"error": "boom"}')
        if mode == "400":
            return self._send(400, b'{"error": "bad request"}')
        if mode == "401-echo-key":
            return self._send(401, json.dumps({"error": f"bad key {self.headers.get('Authorization')}"}).encode())
        if mode in ("302", "307"):
            return self._send(int(mode), b"", [("Location", f"http://127.0.0.1:{self.evil_port}/v1/chat/completions")])
        if mode == "non-utf8":
            return self._send(200, b'{"choices": [{"message": {"content": "\xff\xfe bad"}}]}')
        if mode == "invalid-json":
            return self._send(200, b'{"choices": [')
        if mode == "html":
            return self._send(200, b"<html><body>Gateway</body></html>", [("Content-Type", "text/html")])
        if mode == "content-int":
            return self._send(200, self._ok(42))
        if mode == "content-list":
            return self._send(200, self._ok(["a", "b"]))
        if mode == "content-null":
            return self._send(200, self._ok(None))
        if mode == "no-choices":
            return self._send(200, b'{"choices": []}')
        if mode == "length":
            return self._send(200, self._ok(f"ans:{last}", "length"))
        if mode == "dribble":
            self.send_response(200)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            for byte in answer:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(0.5)
            return None
        if mode == "hang":
            time.sleep(30)
            return None
        if mode == "close":
            self.close_connection = True
            return None
        if mode == "truncated":
            return self._send(200, answer[:10], length=len(answer))
        raise ValueError(mode)


class Evil(BaseHTTPRequestHandler):
    """The redirect target: records whether the key reached it, and answers something that must not be kept."""
    got_key = []

    def log_message(self, *a):
        pass

    def _any(self):
        self.got_key.append(self.headers.get("Authorization"))
        data = json.dumps({"choices": [{"message": {"content": "EVIL"}, "finish_reason": "stop"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _any


class _Quiet(ThreadingHTTPServer):
    def handle_error(self, request, client_address):  # a client hanging up on a dribble is the point
        pass


def serve(handler):
    srv = _Quiet(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


# mode -> expected: "written" (rows regenerated correctly) or "failed" (every row in errors.jsonl)
SERVER_MODES = {
    "ok": "written", "503-once": "written", "429-retry-after": "written", "length": "written",
    "500": "failed", "400": "failed", "401-echo-key": "failed", "302": "failed", "307": "failed",
    "non-utf8": "failed", "invalid-json": "failed", "html": "failed", "content-int": "failed",
    "content-list": "failed", "content-null": "failed", "no-choices": "failed", "dribble": "failed",
    "hang": "failed", "close": "failed", "truncated": "failed",
}


def conversations(n: int, turns=(1, 2)) -> list[dict]:
    rows = []
    for i in range(n):
        t = []
        for k in range(turns[i % len(turns)]):
            t += [{"from": "human", "value": f"q{i}.{k}"}, {"from": "gpt", "value": f"old{i}.{k}"}]
        rows.append({"id": f"c{i}", "conversations": t})
    return rows

