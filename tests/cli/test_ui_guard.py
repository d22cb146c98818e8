"""calpipe.cli.ui_guard: the guard in front of the dagster UI refuses foreign Host and Origin
headers and GraphQL mutations over GET (regressions of the hardening issue: a web page could
launch a backfill), and passes everything else to the app it guards unchanged. The real
``calpipe ui`` behind it: ``tests/dagster_project/test_ui_process.py``."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route, WebSocketRoute
from starlette.testclient import TestClient

from calpipe.cli.ui_guard import Guard, refusal

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


def test_a_second_host_header_passed_and_an_upper_case_host_was_refused():
    """Two Host headers (a foreign one first) passed, the last one read; LOCALHOST:PORT was
    refused although host names are case-insensitive (found by review)."""
    scope = {"type": "http", "method": "GET", "query_string": b"",
             "headers": [(b"host", b"evil:3999"), (b"host", b"127.0.0.1:3999")]}  # fmt: skip
    assert "several Host headers" in refusal(scope, PORT)
    scope["headers"] = [(b"host", b"127.0.0.1:3999"), (b"origin", b"http://127.0.0.1:3999"),
                        (b"origin", b"https://evil.example")]  # fmt: skip
    assert "several Origin headers" in refusal(scope, PORT)
    scope["headers"] = [(b"host", b"LOCALHOST:3999"), (b"origin", b"http://LocalHost:3999")]
    assert refusal(scope, PORT) is None
