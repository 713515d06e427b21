"""A scripted stand-in for the gateway's HTTP answers (stdlib http.server
on loopback), for the unit tests of the core and its two transports. The
real gateway is tested in tests/ (the Go harness)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Answer = tuple[int, dict[str, str], Any]  # status, headers, JSON (or bytes)
Route = Callable[["Seen"], Answer]


class Seen:
    def __init__(self, method: str, path: str, headers: dict[str, str], body: Any | None):
        self.method, self.path, self.headers, self.body = method, path, headers, body


class FakeGateway:
    """Serves ``route(seen)`` for every request; ``chunked`` sends bodies
    with Transfer-Encoding: chunked (as Go's net/http does for large ones)."""

    def __init__(self, route: Route, chunked: bool = False):
        self.route, self.chunked = route, chunked
        self.seen: list[Seen] = []
        self.lock = threading.Lock()
        gw = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def _serve(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                seen = Seen(self.command, self.path, {k.lower(): v for k, v in self.headers.items()},
                            json.loads(raw) if raw else None)
                with gw.lock:
                    gw.seen.append(seen)
                status, headers, payload = gw.route(seen)
                body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                if gw.chunked:
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for i in range(0, len(body), 7):
                        part = body[i:i + 7]
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                    self.wfile.write(b"0\r\n\r\n")
                else:
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                self.close_connection = True

            do_GET = do_POST = _serve

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)

    def count(self, method: str, suffix: str) -> int:
        with self.lock:
            return sum(1 for s in self.seen if s.method == method and s.path.split("?")[0].endswith(suffix))


def decision(outcome: str, state: str = "", **kw: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"outcome": outcome, "org": "acme", "mandate_id": "m-1", "authorization_id": "au_1"}
    if state:
        d["authorization"] = {"state": state, **kw.pop("authorization", {})}
    d.update(kw)
    return d


def problem(status: int, reason: str, d: dict[str, Any] | None = None) -> Answer:
    body: dict[str, Any] = {"type": "urn:mandated:reason:" + reason, "status": status, "reason": reason,
                            "detail": reason.replace("_", " ")}
    if d is not None:
        body["decision"] = d
    return status, {"Content-Type": "application/problem+json"}, body
