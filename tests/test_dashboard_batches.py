"""The dashboard's batch pages over HTTP (no browser): the list and its state filter, a
batch's page (progress, callbacks, parent, failed and waited-on members, all linked), the
links from a member's and a callback's event page and from the workflow graph; escaping,
bad ids, read-only."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from core_support import ServicePool

from delayq import Event, EventService
from delayq.batches import BATCH_TYPE
from delayq.dashboard import create_app

EVIL = "<script>alert(1)</script>"


class DashRow(Event, event_name="dash-batch-row"):
    """A member: fails when ``fail`` is set (no retries: a dead letter at once)."""

    fail: bool = False


class DashNest(Event, event_name="dash-batch-nest"):
    """A member whose handler opens a nested batch with one member due in an hour."""


class DashCallback(Event, event_name="dash-batch-callback"):
    """A callback nobody handles: it stays, so its page can be looked at."""


@pytest.fixture
async def setup(redis_url: str, prefix: str) -> AsyncIterator[tuple[EventService, EventService]]:
    pool = ServicePool(redis_url, prefix, retry_attempts=0)
    nested: list[str] = []

    async def row(event: DashRow) -> None:
        if event.fail:
            raise RuntimeError(EVIL)

    try:
        worker = await pool.start(heartbeat_interval=0)

        async def nest(event: DashNest) -> None:
            async with worker.batch(name="nested " + EVIL) as child:
                await child.enqueue_with_delay(DashRow(id="deep<&>"), 3600)
            nested.append(child.id)

        worker.add_handler(DashRow, row)
        worker.add_handler(DashNest, nest)
        worker.nested = nested  # type: ignore[attr-defined]
        yield worker, pool.producer(heartbeat_interval=0)
    finally:
        await pool.aclose()


def _client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://dash.test")


def _between(html: str, start: str, end: str) -> str:
    return html.split(start, 1)[1].split(end, 1)[0]


async def test_batch_pages_link_everything_and_escape_it(setup, wait_for) -> None:
    worker, service = setup
    # done, one member failed: on_complete enqueued (nobody handles it), on_success skipped
    async with service.batch(
        on_complete=DashCallback(id="a-cb<&>"), on_success=DashCallback(id="a-ok"), name=EVIL
    ) as a:
        await a.enqueue_many([DashRow(id="ok<&>"), DashRow(id="bad<&>", fail=True)])

    async def a_done() -> bool:
        return (await service.batch_info(a.id)).state == "done"

    await wait_for(a_done)
    # waiting: on a member due in an hour and on a nested batch (opened by a member)
    async with service.batch(name="outer") as b:
        await b.enqueue_with_delay(DashRow(id="later<&>"), 3600)
        await b.enqueue_with_delay(DashNest(id="nest"), 0)
    await wait_for(lambda: worker.nested)
    (child,) = worker.nested

    async def child_pending() -> bool:
        info = await service.batch_info(b.id, members=10)
        return (BATCH_TYPE, child) in info.waiting_on and info.pending == 2

    await wait_for(child_pending)

    async with _client(create_app(service)) as http:
        # the list: every batch, newest first; the filter; the nav link
        r = await http.get("/batches")
        assert r.status_code == 200 and 'id="nav-batches"' in r.text
        rows = re.findall(r'<tr class="batch-row" data-id="(\w+)" data-state="(\w+)"', r.text)
        assert rows == [(child, "waiting"), (b.id, "waiting"), (a.id, "done")]
        assert EVIL not in r.text and "&lt;script&gt;alert(1)&lt;/script&gt;" in r.text
        assert f'href="/batch?id={a.id}"' in r.text
        r = await http.get("/batches", params={"state": "done"})
        assert re.findall(r'class="batch-row" data-id="(\w+)"', r.text) == [a.id]
        r = await http.get("/batches", params={"state": "stuck"})
        assert r.status_code == 200 and 'id="no-batches"' in r.text
        assert (await http.get("/batches", params={"state": "closed"})).status_code == 400

        # a done batch: its progress, callbacks, failed member (its dead letter's page)
        r = await http.get("/batch", params={"id": a.id})
        assert r.status_code == 200 and EVIL not in r.text
        assert 'id="batch-state">done<' in r.text and "on_success skipped" in r.text
        bar = _between(r.text, 'id="batch-progress"', "</svg>")
        assert re.findall(r'<rect class="(ok|bad|pending)" data-count="(\d+)"', bar) == [
            ("ok", "1"), ("bad", "1"),
        ]  # fmt: skip
        assert "data-live-url" not in r.text  # done: nothing left to refresh
        on_complete = _between(r.text, 'id="batch-on-complete"', "</a>")
        assert 'href="/event?type=dash-batch-callback&amp;id=a-cb%3C%26%3E"' in on_complete
        failed = _between(r.text, 'id="batch-failed-members"', "</table>")
        assert 'href="/event?type=dash-batch-row&amp;id=bad%3C%26%3E"' in failed
        assert "bad&lt;&amp;&gt;" in failed and "bad<&>" not in failed
        assert 'method="post"' not in r.text  # read-only pages: no action, no token
        # the failed member's page: its dead letter, and the batch it belongs to
        r = await http.get("/event", params={"type": "dash-batch-row", "id": "bad<&>"})
        assert 'id="event-state">dead<' in r.text
        assert f'id="event-batch" href="/batch?id={a.id}"' in r.text

        # the callback's page: "runs after" the batch; its parent (the batch) links there
        r = await http.get("/event", params={"type": "dash-batch-callback", "id": "a-cb<&>"})
        assert r.status_code == 200
        assert f'class="event-link batch-link after-batch" href="/batch?id={a.id}"' in r.text
        parents = _between(r.text, 'id="event-parents"', "</table>")
        assert f'href="/batch?id={a.id}"' in parents and BATCH_TYPE not in parents
        svg = _between(r.text, 'id="event-workflow"', "</svg>")
        (parent,) = re.findall(r'<a class="node parent"[^>]*>', svg)
        assert f'href="/batch?id={a.id}"' in parent and 'data-state="failed"' in parent
        assert f"batch {a.id[:10]}" in svg

        # a waiting batch: refreshed live; what it waits on, the nested batch linked
        r = await http.get("/batch", params={"id": b.id})
        assert 'id="batch-state">waiting<' in r.text
        assert f'data-live-url="/live/batch?id={b.id}"' in r.text
        waiting = _between(r.text, 'id="batch-waiting-on"', "</table>")
        assert f'href="/batch?id={child}"' in waiting
        assert 'href="/event?type=dash-batch-row&amp;id=later%3C%26%3E"' in waiting
        live = await http.get("/live/batch", params={"id": b.id})
        assert live.status_code == 200 and 'id="batch-pending">2<' in live.text
        assert "<html" not in live.text
        # the nested batch: its parent linked
        r = await http.get("/batch", params={"id": child})
        assert f'id="batch-parent" href="/batch?id={b.id}"' in r.text
        assert "nested &lt;script&gt;" in r.text

        # a member's page: its batch, and the batch as its child in the workflow graph
        r = await http.get("/event", params={"type": "dash-batch-row", "id": "later<&>"})
        assert f'id="event-batch" href="/batch?id={b.id}"' in r.text and ">outer<" in r.text
        svg = _between(r.text, 'id="event-workflow"', "</svg>")
        (kid,) = re.findall(r'<a class="node child"[^>]*>', svg)
        assert f'href="/batch?id={b.id}"' in kid and 'data-state="waiting"' in kid
        # a batch where an event would be: its page
        r = await http.get("/event", params={"type": BATCH_TYPE, "id": b.id})
        assert r.status_code == 303 and r.headers["location"] == f"/batch?id={b.id}"

        # no such batch: 404 page; a malformed id or none: 400
        r = await http.get("/batch", params={"id": "nothing-here"})
        assert r.status_code == 404 and "No such batch" in r.text
        for params in ({"id": "bad id!"}, {}, {"id": EVIL}):
            r = await http.get("/batch", params=params)
            assert r.status_code == 400, params
            assert r.headers["content-type"].startswith("text/plain")  # never HTML
            assert r.headers["x-content-type-options"] == "nosniff"

    # read-only: the same pages, nothing to refuse (they have no action)
    async with _client(create_app(service, read_only=True)) as http:
        for path, params in (("/batches", {}), ("/batch", {"id": a.id})):
            r = await http.get(path, params=params)
            assert r.status_code == 200 and 'method="post"' not in r.text


async def test_an_empty_batch_and_a_open_one(setup) -> None:
    _, service = setup
    async with service.batch(name="empty") as empty:
        pass
    async with service.batch() as open_:
        await open_.enqueue_with_delay(DashRow(id="o1"), 3600)
        async with _client(create_app(service)) as http:
            r = await http.get("/batch", params={"id": open_.id})
            assert 'id="batch-state">open<' in r.text and "lease until" in r.text
            r = await http.get("/batch", params={"id": empty.id})
            assert r.status_code == 200 and 'id="batch-total">0<' in r.text
            assert 'id="batch-state">done<' in r.text
            bar = _between(r.text, 'id="batch-progress"', "</svg>")
            assert 'class="track"' in bar and "data-count" not in bar
