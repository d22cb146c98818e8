"""The guard in front of the dagster UI that ``calpipe ui`` serves.

``dagster dev`` answers any Host header and runs GraphQL mutations sent with GET, so a web page
the user visits could launch a run or a backfill through the user's browser (a forged request
to ``http://127.0.0.1:3000/graphql?query=mutation...``, or DNS rebinding to a name that
resolves to 127.0.0.1). ``calpipe ui`` therefore starts dagster on an internal loopback port
and serves the UI through :class:`Guard` (an ASGI middleware) over :func:`proxy_app` (an HTTP
and WebSocket reverse proxy), which refuse with 403, before anything reaches dagster:

* a ``Host`` header other than ``127.0.0.1:PORT`` / ``localhost:PORT`` (DNS rebinding);
* an ``Origin`` header of another site (cross-site POSTs and WebSockets);
* a GraphQL ``mutation`` sent with GET or HEAD (a link or an ``<img>`` could send it).

Reads are unaffected, and the UI itself (same origin, POST for GraphQL) works as before.
"""

from __future__ import annotations

import asyncio
import re
import socket
from urllib.parse import parse_qs

_MUTATION = re.compile(rb"\bmutation\b", re.IGNORECASE)
#: Hop-by-hop headers a proxy must not forward (RFC 9110 §7.6.1), plus the ones it rewrites.
_HOP = {
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
    b"trailer", b"transfer-encoding", b"upgrade", b"host", b"content-length",
}  # fmt: skip


def refusal(scope: dict, port: int) -> str | None:
    """Why the request of ASGI ``scope`` must not reach dagster, or None if it may."""
    headers = {k.lower(): v for k, v in scope.get("headers", [])}
    hosts = {f"127.0.0.1:{port}".encode(), f"localhost:{port}".encode()}
    host = headers.get(b"host", b"")
    if host not in hosts:
        return f"Host {host.decode(errors='replace')!r} is not this UI (127.0.0.1:{port})"
    origin = headers.get(b"origin")
    if origin is not None and origin not in {b"http://" + h for h in hosts}:
        return f"Origin {origin.decode(errors='replace')!r} is another site"
    if scope["type"] == "http" and scope.get("method") in ("GET", "HEAD"):
        query = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("query", [])
        if any(_MUTATION.search(q.encode("latin-1", errors="replace")) for q in query):
            return "a GraphQL mutation sent with GET (use POST from the UI)"
    return None


class Guard:
    """ASGI middleware: 403 for what :func:`refusal` refuses, else the wrapped app."""

    def __init__(self, app, port: int):
        self.app, self.port = app, port

    async def __call__(self, scope, receive, send):
        if scope["type"] in ("http", "websocket"):
            why = refusal(scope, self.port)
            if why is not None:
                if scope["type"] == "websocket":  # closing before accept: a 403 handshake
                    await send({"type": "websocket.close", "code": 1008, "reason": why})
                    return
                body = f"calpipe ui: refused: {why}\n".encode()
                await send({"type": "http.response.start", "status": 403,
                            "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                        (b"content-length", str(len(body)).encode())]})  # fmt: skip
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def proxy_app(upstream_port: int):
    """An ASGI app forwarding HTTP and WebSocket requests to ``127.0.0.1:upstream_port``."""
    import httpx
    import websockets

    base = f"127.0.0.1:{upstream_port}"
    client = httpx.AsyncClient(base_url=f"http://{base}", timeout=None)

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await client.aclose()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        target = scope["raw_path"].decode("latin-1") if scope.get("raw_path") else scope["path"]
        if scope.get("query_string"):
            target += "?" + scope["query_string"].decode("latin-1")
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _HOP]
        if scope["type"] == "http":
            body, more = b"", True
            while more:
                msg = await receive()
                body += msg.get("body", b"")
                more = msg.get("more_body", False)
            req = client.build_request(scope["method"], target, headers=headers, content=body)
            resp = await client.send(req, stream=True)
            try:
                out = [(k, v) for k, v in resp.headers.raw if k.lower() not in _HOP]
                await send({"type": "http.response.start", "status": resp.status_code,
                            "headers": out})  # fmt: skip
                async for chunk in resp.aiter_raw():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b""})
            finally:
                await resp.aclose()
        elif scope["type"] == "websocket":
            await _pump_websocket(scope, receive, send, f"ws://{base}{target}", websockets)

    return app


async def _pump_websocket(scope, receive, send, url, websockets):
    """Accept the client's WebSocket once the upstream one is open, then relay both ways."""
    protocols = scope.get("subprotocols") or None
    async with websockets.connect(url, subprotocols=protocols, max_size=None) as up:
        msg = await receive()  # websocket.connect
        if msg["type"] != "websocket.connect":
            return
        await send({"type": "websocket.accept", "subprotocol": up.subprotocol})

        client_gone = False  # once the client disconnected, nothing more may be sent to it

        async def client_to_up():
            nonlocal client_gone
            while True:
                m = await receive()
                if m["type"] == "websocket.disconnect":
                    client_gone = True
                    await up.close()
                    return
                await up.send(m["bytes"] if m.get("bytes") is not None else m["text"])

        async def up_to_client():
            async for data in up:
                if client_gone:
                    return
                key = "bytes" if isinstance(data, bytes) else "text"
                await send({"type": "websocket.send", key: data})
            if not client_gone:  # the upstream ended first: close the client's side (once)
                await send({"type": "websocket.close", "code": 1000})

        tasks = [asyncio.ensure_future(client_to_up()), asyncio.ensure_future(up_to_client())]
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for t in pending:
            t.cancel()
        for t in done:  # an error of the relay reaches the server's log, not a lost task's
            t.result()


def serve(port: int, upstream_port: int) -> None:
    """Serve the guarded UI on 127.0.0.1:``port`` (blocking)."""
    import uvicorn

    uvicorn.run(Guard(proxy_app(upstream_port), port), host="127.0.0.1", port=port,
                log_level="warning", ws="websockets")  # fmt: skip


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
