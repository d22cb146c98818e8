"""The guard in front of the dagster UI that ``calpipe ui`` serves.

``dagster dev`` answers any Host header and runs GraphQL mutations sent with GET, so a web page
the user visits could launch a run or a backfill through the user's browser (a forged request
to ``http://127.0.0.1:3000/graphql?query=mutation...``, or DNS rebinding to a name that
resolves to 127.0.0.1). ``calpipe ui`` therefore serves dagster's own ASGI app in one process
wrapped in :class:`Guard` (an ASGI middleware, :func:`server`), on the one TCP port it opens
(:mod:`calpipe.dagster_project.webserver`); the guard refuses with 403, before anything
reaches dagster:

* a ``Host`` header other than ``127.0.0.1:PORT`` / ``localhost:PORT`` (DNS rebinding),
  in any case, and a request with two ``Host`` or two ``Origin`` headers;
* an ``Origin`` header of another site (cross-site POSTs and WebSockets);
* a GraphQL ``mutation`` sent with GET or HEAD (a link or an ``<img>`` could send it).

Reads are unaffected, and the UI itself (same origin, POST for GraphQL) works as before.
"""

from __future__ import annotations

import re
import socket
from urllib.parse import parse_qs

_MUTATION = re.compile(rb"\bmutation\b", re.IGNORECASE)


def refusal(scope: dict, port: int) -> str | None:
    """Why the request of ASGI ``scope`` must not reach dagster, or None if it may."""
    pairs = [(k.lower(), v) for k, v in scope.get("headers", [])]
    for name in (b"host", b"origin"):  # a second one could be read instead of the one checked
        if sum(k == name for k, _ in pairs) > 1:
            return f"the request has several {name.decode().title()} headers"
    headers = dict(pairs)
    hosts = {f"127.0.0.1:{port}".encode(), f"localhost:{port}".encode()}
    host = headers.get(b"host", b"").lower()  # host names are case-insensitive
    if host not in hosts:
        return f"Host {host.decode(errors='replace')!r} is not this UI (127.0.0.1:{port})"
    origin = headers.get(b"origin")
    if origin is not None and origin.lower() not in {b"http://" + h for h in hosts}:
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


#: What every request gets while the UI starts: 503 with a retry hint, and a page that reloads
#: itself (a browser opened on the URL meanwhile lands on the UI, not on an error).
STARTING_PAGE = (
    b"<!doctype html><html><head><meta charset=utf-8><meta http-equiv=refresh content=1>"
    b"<title>calpipe ui: starting</title></head><body style='font-family:sans-serif'>"
    b"<p>calpipe ui is starting: loading dagster and the code location. This page reloads "
    b"itself.</p></body></html>"
)


class Starting:
    """ASGI app of the port while the UI starts: :data:`STARTING_PAGE` (503) to every HTTP
    request, a refused handshake to a WebSocket; :meth:`serve_app` then hands every later
    request to the real app. The port is open from the start, so nothing between "calpipe ui"
    and a ready UI is a 500 or a refused connection."""

    def __init__(self):
        self.app = None

    def serve_app(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if self.app is not None:
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1013, "reason": "starting"})
        elif scope["type"] == "http":
            await send({"type": "http.response.start", "status": 503,
                        "headers": [(b"content-type", b"text/html; charset=utf-8"),
                                    (b"retry-after", b"1"), (b"cache-control", b"no-store"),
                                    (b"content-length", str(len(STARTING_PAGE)).encode())]})  # fmt: skip
            await send({"type": "http.response.body", "body": STARTING_PAGE})


def server(app, port: int):
    """A uvicorn server of ASGI ``app`` behind :class:`Guard` on 127.0.0.1:``port`` (the one
    TCP port of ``calpipe ui``: dagster's app runs in the same process,
    :mod:`calpipe.dagster_project.webserver`, not behind a proxy to a port of its own). Run it
    with ``.run()`` (in a thread it installs no signal handler: the caller stops it by setting
    ``should_exit``); no lifespan events (the apps it serves need none)."""
    import uvicorn

    config = uvicorn.Config(Guard(app, port), host="127.0.0.1", port=port,
                            log_level="warning", lifespan="off")  # fmt: skip
    return uvicorn.Server(config)


def port_free(host: str, port: int) -> bool:
    """Whether ``host``:``port`` can be listened on now (a port another process listens on
    cannot; one only in TIME_WAIT can, as uvicorn binds it with SO_REUSEADDR)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
