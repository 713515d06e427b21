"""HTTP/1.1 over asyncio streams: one connection per exchange, standard
library only.

Why streams and not urllib in a thread pool: a thread per waiting request
would cap concurrency at the pool's size (asyncio's default executor has
min(32, CPUs + 4) threads: 6 on a 2-core machine, fewer than 8 resumers
long-polling ``Prefer: wait``), and a thread cannot be cancelled, so a
cancelled task would leave its request running. Here every exchange is a
coroutine: cancelling it closes its socket, and a thousand resumers wait on
one event loop. What this leaves out, deliberately: proxies (urllib's
``*_proxy`` variables), connection reuse and HTTP/2 — the gateway is a
short hop, and a command's cost is its decision, not its TCP handshake.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import urllib.parse

from .._core import Request, Response

MAX_HEAD = 64 * 1024
MAX_BODY = 16 * 1024 * 1024


async def exchange(req: Request, ssl_context: ssl.SSLContext | None = None) -> Response:
    """Sends one request and reads its whole answer within ``req.timeout``.
    Raises ``OSError`` (``TimeoutError``, ``ConnectionError``) when nothing
    usable was answered."""
    try:
        return await asyncio.wait_for(_exchange(req, ssl_context), req.timeout)
    except asyncio.TimeoutError:
        raise TimeoutError(f"no answer from {req.url} within {req.timeout:.1f}s") from None
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as err:
        raise ConnectionError(f"malformed answer from {req.url}: {err}") from None


async def _exchange(req: Request, ssl_context: ssl.SSLContext | None) -> Response:
    u = urllib.parse.urlsplit(req.url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"not an http(s) URL: {req.url!r}")
    tls = u.scheme == "https"
    port = u.port or (443 if tls else 80)
    ctx = (ssl_context or ssl.create_default_context()) if tls else None
    reader, writer = await asyncio.open_connection(u.hostname, port, ssl=ctx, limit=MAX_HEAD,
                                                   server_hostname=u.hostname if tls else None)
    try:
        writer.write(_head(req, u, port, tls) + (req.body or b""))
        await writer.drain()
        status, headers = _parse_head(await reader.readuntil(b"\r\n\r\n"))
        return Response(status, headers, await _body(reader, headers))
    finally:
        writer.close()
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            await writer.wait_closed()


def _head(req: Request, u: urllib.parse.SplitResult, port: int, tls: bool) -> bytes:
    target = (u.path or "/") + ("?" + u.query if u.query else "")
    host = u.hostname or ""
    if ":" in host:
        host = "[" + host + "]"
    if port != (443 if tls else 80):
        host += f":{port}"
    lines = [f"{req.method} {target} HTTP/1.1", f"Host: {host}", "Connection: close",
             f"Content-Length: {len(req.body or b'')}"]
    for k, v in req.headers.items():
        if any(c in k + v for c in "\r\n\0") or ":" in k:
            raise ValueError(f"header {k!r} has a character HTTP forbids")
        lines.append(f"{k}: {v}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
        raise ValueError(f"bad status line {lines[0]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        k, sep, v = line.partition(":")
        if not sep:
            raise ValueError(f"bad header line {line!r}")
        headers[k.strip().lower()] = v.strip()
    return int(parts[1]), headers


async def _body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        out = bytearray()
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0].strip(), 16)
            if size == 0:
                await reader.readuntil(b"\r\n")  # no trailers from the gateway: the final CRLF
                return bytes(out)
            if len(out) + size > MAX_BODY:
                raise ValueError("answer larger than 16 MiB")
            out += await reader.readexactly(size)
            await reader.readexactly(2)
    if "content-length" in headers:
        n = int(headers["content-length"])
        if n < 0 or n > MAX_BODY:
            raise ValueError(f"content-length {n}")
        return await reader.readexactly(n)
    out = bytearray()
    while chunk := await reader.read(64 * 1024):  # until the server closes
        out += chunk
        if len(out) > MAX_BODY:
            raise ValueError("answer larger than 16 MiB")
    return bytes(out)
