"""calpipe.cli.ui_guard: the guard in front of the dagster UI refuses foreign Host and Origin
headers and GraphQL mutations over GET (regressions of the hardening issue: a web page could
launch a backfill), and passes everything else through its proxy unchanged. The last test runs
the real ``calpipe ui`` (dagster dev behind the guard)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route, WebSocketRoute
from starlette.testclient import TestClient

from calpipe.cli.ui_guard import Guard, free_port, refusal

PORT = 3999
BASE = f"http://127.0.0.1:{PORT}"


async def _echo(request):
    body = await request.body()
    return PlainTextResponse(f"{request.method} {request.url.path} {body.decode()}")


async def _ws(ws):
    await ws.accept()
    await ws.send_text(await ws.receive_text())
    await ws.close()


def _client():
    app = Starlette(routes=[Route("/{p:path}", _echo, methods=["GET", "POST", "HEAD"]),
                            WebSocketRoute("/ws", _ws)])  # fmt: skip
    return TestClient(Guard(app, PORT), base_url=BASE)


def test_the_ui_itself_goes_through():
    c = _client()
    assert c.get("/runs").text == "GET /runs "
    r = c.post("/graphql", content=b'{"query": "mutation { x }"}',
               headers={"Origin": BASE})  # fmt: skip
    assert r.status_code == 200  # the UI posts its mutations from its own origin
    assert c.get("/graphql", params={"query": "{ version }"}).status_code == 200
    # (the test client's WebSocket sends Host "testserver" unless told)
    with c.websocket_connect("/ws", headers={"Origin": BASE, "Host": f"127.0.0.1:{PORT}"}) as ws:
        ws.send_text("hi")
        assert ws.receive_text() == "hi"


def test_a_graphql_mutation_over_get_was_run():
    r = _client().get("/graphql", params={"query": "mutation { launchPartitionBackfill(x: 1) }"})
    assert r.status_code == 403 and "mutation sent with GET" in r.text


@pytest.mark.parametrize("host", ["evil.example:3999", "127.0.0.1:4000", "attacker.test"])
def test_a_foreign_host_header_was_answered(host):
    """DNS rebinding: a name of the attacker's that resolves to 127.0.0.1."""
    r = _client().get("/runs", headers={"Host": host})
    assert r.status_code == 403 and "is not this UI" in r.text


def test_a_cross_site_post_and_websocket_are_refused():
    c = _client()
    r = c.post("/graphql", content=b"{}", headers={"Origin": "https://evil.example"})
    assert r.status_code == 403 and "another site" in r.text
    with pytest.raises(Exception):  # noqa: B017 (starlette raises WebSocketDisconnect)
        with c.websocket_connect(
            "/ws", headers={"Origin": "https://evil.example", "Host": f"127.0.0.1:{PORT}"}
        ):
            pass


def test_refusal_rules():
    scope = {"type": "http", "method": "GET", "headers": [(b"host", b"localhost:3999")],
             "query_string": b"query=%7B%20runs%20%7D"}  # fmt: skip
    assert refusal(scope, PORT) is None
    scope["query_string"] = b"query=MUTATION%20%7B%20x%20%7D"
    assert "mutation" in refusal(scope, PORT)


@pytest.mark.slow
def test_calpipe_ui_serves_dagster_behind_the_guard(tmp_path):
    """The real thing: calpipe ui (dagster dev) on a free port; the UI answers through the
    guard, and the guard refuses a GET mutation and a foreign Host before dagster sees them."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "DAGSTER_DISABLE_TELEMETRY": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "calpipe.cli", "ui", "--db", str(tmp_path / "ui.duckdb"),
         "--port", str(port)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            try:
                if httpx.get(f"{base}/server_info", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline and proc.poll() is None, "calpipe ui did not start"
            time.sleep(1)
        ok = httpx.post(f"{base}/graphql", json={"query": "{ version }"},
                        headers={"Origin": base}, timeout=30)  # fmt: skip
        assert ok.status_code == 200 and "version" in ok.json()["data"]
        bad = httpx.get(f"{base}/graphql",
                        params={"query": "mutation { terminateRun(runId: \"x\") { __typename } }"},
                        timeout=30)  # fmt: skip
        assert bad.status_code == 403
        assert httpx.get(f"{base}/server_info", headers={"Host": "evil.example"},
                         timeout=30).status_code == 403  # fmt: skip
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _serve_in_thread(app, port):
    import threading

    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error",
                                           ws="websockets"))  # fmt: skip
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 20
    while not server.started:
        assert time.time() < deadline
        time.sleep(0.05)
    return server, thread


def test_the_proxy_relays_http_and_websockets_to_the_upstream():
    """Through a real server pair: the guarded proxy relays a POST body, a streamed response,
    and WebSocket messages both ways with the negotiated subprotocol (dagster's UI
    subscriptions speak graphql-ws over a WebSocket)."""
    import asyncio

    import websockets

    from calpipe.cli.ui_guard import proxy_app

    async def sub(ws):
        await ws.accept(subprotocol="graphql-ws")
        for _ in range(2):
            await ws.send_text("echo " + await ws.receive_text())
        await ws.close()

    upstream = Starlette(routes=[Route("/{p:path}", _echo, methods=["GET", "POST"]),
                                 WebSocketRoute("/graphql", sub)])  # fmt: skip
    up_port, port = free_port(), free_port()
    servers = [_serve_in_thread(upstream, up_port), _serve_in_thread(
        Guard(proxy_app(up_port), port), port)]  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        r = httpx.post(f"{base}/graphql", content=b"payload", headers={"Origin": base})
        assert r.status_code == 200 and r.text == "POST /graphql payload"

        async def talk():
            async with websockets.connect(f"ws://127.0.0.1:{port}/graphql",
                                          subprotocols=["graphql-ws"]) as ws:  # fmt: skip
                assert ws.subprotocol == "graphql-ws"
                out = []
                for m in ("a", "b"):
                    await ws.send(m)
                    out.append(await ws.recv())
                return out

        assert asyncio.run(talk()) == ["echo a", "echo b"]
        assert httpx.get(f"{base}/x", headers={"Host": "evil.example"}).status_code == 403
    finally:
        for server, thread in servers:
            server.should_exit = True
            thread.join(timeout=10)


def test_a_client_closing_a_busy_websocket_leaves_no_error():
    """Regression: a browser tab closing while dagster still streamed a subscription made the
    relay send a close after the client's disconnect (RuntimeError "Unexpected ASGI message
    'websocket.close'" in the UI's log)."""
    import asyncio
    import logging

    import websockets

    from calpipe.cli.ui_guard import proxy_app

    async def stream(ws):
        await ws.accept()
        try:
            while True:
                await ws.send_text("tick")
                await asyncio.sleep(0.01)
        except Exception:
            return

    upstream = Starlette(routes=[WebSocketRoute("/graphql", stream)])
    up_port, port = free_port(), free_port()
    servers = [_serve_in_thread(upstream, up_port), _serve_in_thread(
        Guard(proxy_app(up_port), port), port)]  # fmt: skip
    errors = []

    class Collect(logging.Handler):
        def emit(self, record):
            errors.append(record)

    # uvicorn's loggers do not propagate to the root (caplog): listen on them directly
    handler = Collect(level=logging.ERROR)
    for name in ("uvicorn.error", "asyncio"):
        logging.getLogger(name).addHandler(handler)
    try:

        async def leave():
            for _ in range(5):
                async with websockets.connect(f"ws://127.0.0.1:{port}/graphql") as ws:
                    assert await ws.recv() == "tick"
                await asyncio.sleep(0.1)  # the relay notices the close while upstream streams

        asyncio.run(leave())
        time.sleep(0.5)
    finally:
        for server, thread in servers:
            server.should_exit = True
            thread.join(timeout=10)
        for name in ("uvicorn.error", "asyncio"):
            logging.getLogger(name).removeHandler(handler)
    assert not errors, [r.getMessage() for r in errors]
