"""The dashboard fixes of issue 23 over HTTP (no browser), on a real Redis: the CSRF Origin
check behind a proxy, bidi controls, security headers on refusals, confirmations, counts,
the ready list, in-flight details, searches and the small bugs."""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import AsyncIterator

import httpx
import pytest
from core_support import ServicePool

from delayq import Event, EventService
from delayq.dashboard import create_app


class Item(Event, event_name="hard-item"):
    """A plain event."""


class Parted(Event, event_name="hard-parted", partitions=3):
    """A partitioned event."""


class Broken(Event, event_name="hard-broken"):
    """Fails every time."""


async def _broken(event: Broken) -> None:
    raise RuntimeError(f"Timeout calling {event.id}" if event.id.startswith("t") else "Refused")


@pytest.fixture
async def setup(redis_url: str, prefix: str) -> AsyncIterator[tuple[EventService, ServicePool]]:
    pool = ServicePool(redis_url, prefix, retry_attempts=0)
    try:
        yield pool.producer(heartbeat_interval=0), pool
    finally:
        await pool.aclose()


def _client(app, base: str = "http://dash.test") -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base)


def _csrf(html: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', html)
    assert match, "no CSRF field on the page"
    return match.group(1)


async def _dead(service: EventService, pool: ServicePool, wait_for, ids: list[str]) -> None:
    worker = await pool.start(heartbeat_interval=0)
    worker.add_handler(Broken, _broken)
    before = (await service.stats_for(Broken)).dead
    await service.enqueue_many([Broken(id=i) for i in ids])

    async def all_dead() -> bool:
        return (await service.stats_for(Broken)).dead == before + len(ids)

    await wait_for(all_dead, timeout=15)
    await worker.remove_handler(Broken)


# -- 15: security ------------------------------------------------------------------------


async def test_origin_check_compares_scheme_refuses_null_and_follows_the_proxy(setup) -> None:
    service, _ = setup
    await service.enqueue_with_delay(Item(id="a"), 3600)
    form = {"type": "hard-item", "id": "a", "action": "run_now"}

    async def post(app, base: str, headers: dict[str, str]) -> int:
        async with _client(app, base) as http:
            token = _csrf((await http.get("/type", params={"name": "hard-item"})).text)
            r = await http.post("/actions/event", data={**form, "csrf": token}, headers=headers)
            return r.status_code

    plain = create_app(service)
    assert await post(plain, "http://dash.test", {"origin": "null"}) == 403
    assert await post(plain, "http://dash.test", {"origin": "https://dash.test"}) == 403
    assert await post(plain, "http://dash.test", {"sec-fetch-site": "cross-site"}) == 403
    # nginx's default proxy_pass: the browser is on https://ops.example.com, the app sees
    # Host: 127.0.0.1:8080. Refused without configuration...
    behind = {"origin": "https://ops.example.com", "host": "127.0.0.1:8080"}
    assert await post(plain, "http://127.0.0.1:8080", behind) == 403
    # ...accepted with the public origin configured (and only that origin, scheme included;
    # the client talks https as the browser does: the cookie is Secure then)
    public = create_app(service, public_origin="https://ops.example.com/")
    assert await post(public, "https://127.0.0.1:8080", behind) == 200
    assert await post(public, "https://127.0.0.1:8080",
                      {**behind, "origin": "http://ops.example.com"}) == 403  # fmt: skip
    assert await post(public, "https://127.0.0.1:8080", {**behind, "origin": "null"}) == 403
    # ...or with trusted forwarded headers
    fwd = create_app(service, trust_forwarded=True)
    headers = {**behind, "x-forwarded-proto": "https", "x-forwarded-host": "ops.example.com"}
    assert await post(fwd, "https://127.0.0.1:8080", headers) == 200
    assert await post(fwd, "https://127.0.0.1:8080",
                      {**headers, "x-forwarded-proto": "http"}) == 403  # fmt: skip
    assert await post(fwd, "https://127.0.0.1:8080", behind) == 403  # no headers: the Host
    with pytest.raises(ValueError):
        create_app(service, public_origin="ops.example.com")


async def test_auth_refusals_carry_the_security_headers(setup) -> None:
    service, _ = setup
    from starlette.exceptions import HTTPException

    def auth(request) -> bool:
        if request.headers.get("x-key") != "sesame":
            raise HTTPException(401, "who are you", headers={"WWW-Authenticate": "Basic"})
        return True

    async with _client(create_app(service, auth=auth)) as http:
        r = await http.get("/")
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Basic"
        ok = await http.get("/", headers={"x-key": "sesame"})
        for name in ("content-security-policy", "x-frame-options", "x-content-type-options",
                     "referrer-policy", "cache-control"):  # fmt: skip
            assert r.headers.get(name) == ok.headers.get(name) and r.headers.get(name), name


async def test_bidi_controls_are_shown_not_obeyed(setup) -> None:
    service, _ = setup
    sneaky = "inv\u202egnp.exe"
    await service.enqueue_with_delay(Item(id=sneaky), 3600, context={"who": "a\u2066b"})
    async with _client(create_app(service)) as http:
        pages = [
            await http.get("/type", params={"name": "hard-item"}),
            await http.get("/live/type", params={"name": "hard-item"}),
            await http.get("/event", params={"type": "hard-item", "id": sneaky}),
            await http.get("/event", params={"id": "inv"}),  # the prefix search
        ]
        for page in pages:
            assert page.status_code == 200
            assert "inv[U+202E]gnp.exe" in page.text
        event = pages[2].text
        assert "a[U+2066]b" in event
        text = "".join(p.text for p in pages)
        assert not re.search("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]",
                             text.split('name="id" value="')[0])  # fmt: skip
        # the form still acts on the real id
        token = _csrf(event)
        assert f'name="id" value="{sneaky}"' in event
        r = await http.post("/actions/event", data={"type": "hard-item", "id": sneaky,
                                                    "action": "run_now", "csrf": token})  # fmt: skip
        assert "Running now" in r.text
    assert (await service.inspect(Item, sneaky)).state == "ready"


# -- 11: confirmations and counts ------------------------------------------------------


async def test_requeue_all_says_how_the_count_differs_from_the_confirmed_one(
    setup, wait_for
) -> None:
    service, pool = setup
    await _dead(service, pool, wait_for, ["r1", "r2"])
    async with _client(create_app(service)) as http:
        page = await http.get("/type", params={"name": "hard-broken"})
        token = _csrf(page.text)
        base = {"type": "hard-broken", "csrf": token, "action": "requeue", "scope": "all"}
        confirm = await http.post("/actions/dead", data=base)
        assert "all 2 dead letters" in confirm.text
        assert '<input type="hidden" name="expected" value="2">' in confirm.text
        await _dead(service, pool, wait_for, ["r3"])  # one more fails meanwhile
        r = await http.post("/actions/dead", data={**base, "confirm": "yes", "expected": "2"})
        assert "Requeued 3 dead letter(s)" in r.text
        assert "2 were there when you confirmed; 1 more failed since" in r.text


async def test_single_purge_and_cancel_ask_first(setup, wait_for) -> None:
    service, pool = setup
    await _dead(service, pool, wait_for, ["p1"])
    await service.enqueue_with_delay(Item(id="c1"), 3600)
    async with _client(create_app(service)) as http:
        token = _csrf((await http.get("/event", params={"type": "hard-broken", "id": "p1"})).text)
        r = await http.post("/actions/dead", data={"type": "hard-broken", "id": "p1",
                                                   "action": "purge", "csrf": token})  # fmt: skip
        assert "Yes, purge" in r.text
        assert (await service.stats_for(Broken)).dead == 1
        r = await http.post("/actions/event", data={"type": "hard-item", "id": "c1",
                                                    "action": "cancel", "csrf": token})  # fmt: skip
        assert "Yes, cancel it" in r.text and 'id="confirm"' in r.text
        assert (await service.inspect(Item, "c1")).state == "scheduled"


# -- 13: bugs ----------------------------------------------------------------------------


async def test_select_all_with_page_size_1000_is_not_too_many_fields(setup) -> None:
    service, _ = setup
    await service.enqueue_with_delay(Item(id="x"), 3600)
    app = create_app(service, page_size=1000)
    async with _client(app) as http:
        token = _csrf((await http.get("/type", params={"name": "hard-item"})).text)
        ids = [f"id-{i}" for i in range(1000)]
        data = {"type": "hard-item", "csrf": token, "action": "requeue", "id": ids}
        r = await http.post("/actions/dead", data=data)
        assert r.status_code == 200 and "Yes, requeue" in r.text
        r = await http.post("/actions/dead", data={**data, "confirm": "yes"})
        assert r.status_code == 200 and "Requeued 0 dead letter(s)" in r.text
        # bounded: far more fields than a page are refused
        r = await http.post("/actions/dead", data={**data, "id": ids * 3})
        assert r.status_code == 400


async def test_huge_offsets_are_400_and_unknown_types_404(setup) -> None:
    service, _ = setup
    await service.enqueue_with_delay(Item(id="x"), 3600)
    async with _client(create_app(service)) as http:
        for param in ("offset", "in_offset", "r_offset", "dead_offset"):
            r = await http.get("/type", params={"name": "hard-item", param: "9223372036854775807"})
            assert r.status_code == 400, (param, r.status_code)
        for path in ("/type", "/live/type"):
            r = await http.get(path, params={"name": "no-such-type"})
            assert r.status_code == 404
            assert "does not exist" in r.text or "No event type" in r.text
        r = await http.get("/event", params={"type": "no-such-type", "id": "x"})
        assert r.status_code == 404 and "No event type" in r.text
        # a list merged from several sets (partitions) reads offset + page of each: bounded
        await service.enqueue_with_delay(Parted(id="p"), 3600)
        r = await http.get("/type", params={"name": "hard-parted", "offset": "20000"})
        assert r.status_code == 400 and "partitions" in r.text
        r = await http.get("/type", params={"name": "hard-parted", "offset": "10000"})
        assert r.status_code == 200


async def test_dead_pager_labels_point_the_right_way(setup, wait_for) -> None:
    service, pool = setup
    await _dead(service, pool, wait_for, ["o1", "o2", "o3"])
    async with _client(create_app(service, page_size=1)) as http:
        first = await http.get("/type", params={"name": "hard-broken"})
        assert 'id="dead-newer"' in first.text and 'id="dead-older"' not in first.text
        second = await http.get("/type", params={"name": "hard-broken", "dead_offset": "1"})
        assert 'id="dead-older"' in second.text
        # "newer" leads to a dead letter that failed later
        failed = [d.failed_at for d in await service.dead_letters(Broken)]
        assert failed == sorted(failed)
        assert re.search(r'href="[^"]*dead_offset=2#dead" id="dead-newer">newer', second.text)


async def test_workers_link_named_groups_and_live_part_has_the_counts(setup, pool_worker) -> None:
    service, _ = pool_worker
    async with _client(create_app(service)) as http:
        page = await http.get("/workers")
        link = re.search(r'class="handler-link" href="([^"]+)">hard-item:audit</a>', page.text)
        assert link, page.text
        target = await http.get(link.group(1).replace("&amp;", "&"))
        assert target.status_code == 200 and 'data-group="audit" class="on"' in target.text
        live = await http.get("/live/type", params={"name": "hard-item"})
        assert 'id="jump"' in live.text and "Upcoming (1)" in live.text


@pytest.fixture
async def pool_worker(setup, wait_for) -> AsyncIterator[tuple[EventService, EventService]]:
    service, pool = setup
    worker = await pool.start(heartbeat_interval=1.0)  # a record lives 3 s: slow CI is fine
    await worker.register_group(Item, "audit")
    hold = asyncio.Event()

    async def handle(event: Item) -> None:
        await hold.wait()

    worker.add_handler(Item, handle)
    worker.add_handler(Item, handle, group="audit")
    await service.enqueue_with_delay(Item(id="later"), 3600)

    async def listed() -> bool:
        return any("hard-item:audit" in w.types for w in await service.workers())

    await wait_for(listed, timeout=10)
    try:
        yield service, worker
    finally:
        hold.set()


# -- 14: views ---------------------------------------------------------------------------


async def test_ready_list_with_cancel_and_in_flight_with_running_time_and_worker(
    setup, pool_worker, wait_for
) -> None:
    service, worker = pool_worker
    await service.enqueue_with_delay(Item(id="run-1"), 0)

    async def running() -> bool:
        workers = await service.workers()
        return any(i == "run-1" for w in workers for i, _ in w.running.get("hard-item", []))

    await wait_for(running, timeout=10)
    async with _client(create_app(service)) as http:
        page = await http.get("/type", params={"name": "hard-item"})
        row = page.text.split('class="in-flight-row" data-id="run-1"')[1].split("</tr>")[0]
        assert f"{socket.gethostname()}:" in row and 'class="running"' in row and "claimed" in row
    # a type whose events nobody takes: they wait in the ready list
    await worker.remove_handler(Item)
    await worker.remove_handler(Item, group="audit")
    await service.enqueue_many([Item(id=f"q{i}") for i in range(3)])

    async def ready() -> bool:
        return (await service.group_stats(Item))["default"].ready == 3

    await wait_for(ready, timeout=10)
    async with _client(create_app(service)) as http:
        page = await http.get("/type", params={"name": "hard-item"})
        ids = re.findall(r'class="ready-row" data-id="([^"]+)"', page.text)
        assert ids == ["q0", "q1", "q2"]
        assert "Ready (3)" in page.text
        token = _csrf(page.text)
        r = await http.post("/actions/event", data={"type": "hard-item", "id": "q1", "csrf": token,
                                                    "action": "cancel", "confirm": "yes"})  # fmt: skip
        assert "Cancelled" in r.text
        page = await http.get("/live/type", params={"name": "hard-item"})
        assert re.findall(r'class="ready-row" data-id="([^"]+)"', page.text) == ["q0", "q2"]


async def test_prefix_search_and_dead_letter_filter(setup, wait_for) -> None:
    service, pool = setup
    await service.enqueue_many([Item(id=f"order-{i}") for i in range(3)], delay=3600)
    await _dead(service, pool, wait_for, ["t1", "t2", "z1"])
    async with _client(create_app(service)) as http:
        r = await http.get("/event", params={"id": "order-"})
        assert r.status_code == 200 and 'id="prefix-results"' in r.text
        assert re.findall(r'class="prefix-row" data-id="([^"]+)"', r.text) == [
            "order-0", "order-1", "order-2"]  # fmt: skip
        r = await http.get("/event", params={"id": "nothing-like-it"})
        assert r.status_code == 404
        page = await http.get("/type", params={"name": "hard-broken", "error": "timeout"})
        assert re.findall(r'class="dead-row" data-id="([^"]+)"', page.text) == ["t1", "t2"]
        assert 'id="filter-result"' in page.text and "(the last)" in page.text


async def test_notice_when_only_the_first_50_types_get_charts(setup) -> None:
    service, _ = setup
    for i in range(51):
        cls = type(f"T{i}", (Event,), {}, event_name=f"hard-many-{i:02d}")
        await service.enqueue_with_delay(cls(id="x"), 3600)
    async with _client(create_app(service)) as http:
        page = await http.get("/")
        assert 'id="charts-limited"' in page.text and "first 50 of 51 types" in page.text


async def test_errors_carry_the_security_headers_too(setup) -> None:
    service, _ = setup

    def auth(request) -> bool:
        if request.url.path == "/boom":
            raise RuntimeError("a bug in the hook")
        return True

    async with _client(create_app(service, auth=auth)) as http:
        r = await http.get("/boom")
        assert r.status_code == 500 and r.headers["x-frame-options"] == "DENY"
        assert "default-src 'none'" in r.headers["content-security-policy"]
