"""The dashboard over HTTP (no browser): pages, escaping, CSRF, read-only, actions."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest
from core_support import ServicePool

from delayq import Event, EventService
from delayq.dashboard import create_app


class Page(Event, event_name="dash-page"):
    """An event with a text field."""

    text: str = ""


class Boom(Event, event_name="dash-boom"):
    """Fails every time."""


async def _boom(event: Boom) -> None:
    raise RuntimeError("<b>boom</b>")


@pytest.fixture
async def setup(redis_url: str, prefix: str) -> AsyncIterator[tuple[EventService, ServicePool]]:
    pool = ServicePool(redis_url, prefix, retry_attempts=0)
    try:
        yield pool.producer(heartbeat_interval=0), pool
    finally:
        await pool.aclose()


def _client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://dash.test")


def _csrf(html: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', html)
    assert match, "no CSRF field on the page"
    return match.group(1)


async def test_pages_render_and_escape_untrusted_data(setup) -> None:
    service, _ = setup
    evil = "<script>alert(1)</script>"
    await service.enqueue_with_delay(Page(id=evil, text=evil), 3600, context={"who": evil})
    async with _client(create_app(service)) as http:
        for path, params in (
            ("/", {}),
            ("/", {"window": "day"}),
            ("/live/overview", {}),
            ("/type", {"name": "dash-page"}),
            ("/live/type", {"name": "dash-page"}),
            ("/event", {"type": "dash-page", "id": evil}),
            ("/event", {"id": evil}),
            ("/workers", {}),
        ):
            r = await http.get(path, params=params)
            assert r.status_code == 200, (path, r.text[:500])
            assert "<script>alert" not in r.text
        r = await http.get("/event", params={"type": "dash-page", "id": evil})
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in r.text
        payload = r.text.split('id="payload">')[1].split("</pre>")[0]
        assert "&#34;text&#34;: &#34;&lt;script&gt;alert(1)&lt;/script&gt;" in payload
        assert "scheduled" in r.text
        assert "default-src 'none'" in r.headers["content-security-policy"]
        r = await http.get("/static/style.css")
        assert r.status_code == 200 and "svg" in r.text
        r = await http.get("/event", params={"id": "nope"})
        assert r.status_code == 404


async def test_actions_need_csrf_and_do_what_they_say(setup, wait_for) -> None:
    service, _ = setup
    await service.enqueue_with_delay(Page(id="a"), 3600)
    await service.enqueue_with_delay(Page(id="b"), 3600)
    async with _client(create_app(service)) as http:
        page = await http.get("/type", params={"name": "dash-page"})
        token = _csrf(page.text)
        # forged: no token, wrong token, other origin
        for data, headers in (
            ({"type": "dash-page", "id": "a", "action": "cancel"}, {}),
            ({"type": "dash-page", "id": "a", "action": "cancel", "csrf": "x" * 64}, {}),
            (
                {"type": "dash-page", "id": "a", "action": "cancel", "csrf": token},
                {"origin": "http://evil.test"},
            ),
        ):
            r = await http.post("/actions/event", data=data, headers=headers)
            assert r.status_code == 403
        assert (await service.inspect("dash-page", "a")).state == "scheduled"
        cancel = {"type": "dash-page", "id": "a", "action": "cancel", "csrf": token}
        r = await http.post("/actions/event", data=cancel)  # asks first
        assert r.status_code == 200 and "Yes, cancel it" in r.text and "Cancelled" not in r.text
        assert (await service.inspect("dash-page", "a")).state == "scheduled"
        r = await http.post("/actions/event", data={**cancel, "confirm": "yes"})
        assert r.status_code == 200 and "Cancelled" in r.text
        assert (await service.inspect("dash-page", "a")).state == "absent"
        r = await http.post(
            "/actions/event",
            data={"type": "dash-page", "id": "b", "action": "run_now", "csrf": token},
        )
        assert "Running now" in r.text
        assert (await service.inspect("dash-page", "b")).state == "ready"


async def test_dead_letter_bulk_actions_ask_first(setup, wait_for) -> None:
    service, pool = setup
    worker = await pool.start(heartbeat_interval=0)
    worker.add_handler(Boom, _boom)
    await service.enqueue_many([Boom(id=f"d{i}") for i in range(3)])

    async def dead() -> bool:
        return (await service.stats_for("dash-boom")).dead == 3

    await wait_for(dead, timeout=10)
    await worker.remove_handler(Boom)
    async with _client(create_app(service)) as http:
        page = await http.get("/type", params={"name": "dash-boom"})
        assert "&lt;b&gt;boom&lt;/b&gt;" in page.text
        token = _csrf(page.text)
        base = {"type": "dash-boom", "csrf": token}
        r = await http.post("/actions/dead", data={**base, "action": "purge", "id": ["d0", "d1"]})
        assert "Yes, purge" in r.text  # a confirmation page, nothing done yet
        assert (await service.stats_for("dash-boom")).dead == 3
        r = await http.post(
            "/actions/dead", data={**base, "action": "purge", "id": ["d0", "d1"], "confirm": "yes"}
        )
        assert "Purged 2 dead letter(s)" in r.text
        r = await http.post("/actions/dead", data={**base, "action": "requeue", "scope": "all"})
        assert "all 1 dead letters" in r.text
        r = await http.post(
            "/actions/dead",
            data={**base, "action": "requeue", "scope": "all", "confirm": "yes"},
        )
        assert "Requeued 1" in r.text
        assert (await service.stats_for("dash-boom")).dead == 0


async def test_read_only_hides_and_refuses_actions(setup) -> None:
    service, _ = setup
    await service.enqueue_with_delay(Page(id="a"), 3600)
    async with _client(create_app(service, read_only=True)) as http:
        page = await http.get("/type", params={"name": "dash-page"})
        assert "read-only" in page.text and 'method="post"' not in page.text.split("</header>")[1]
        event = await http.get("/event", params={"type": "dash-page", "id": "a"})
        assert "Cancel" not in event.text
        token = _csrf(page.text) if 'name="csrf"' in page.text else "x"
        r = await http.post(
            "/actions/event",
            data={"type": "dash-page", "id": "a", "action": "cancel", "csrf": token},
        )
        assert r.status_code == 403
    assert (await service.inspect("dash-page", "a")).state == "scheduled"


async def test_auth_hook(setup) -> None:
    service, _ = setup

    def auth(request) -> bool:
        return request.headers.get("x-key") == "sesame"

    async with _client(create_app(service, auth=auth)) as http:
        assert (await http.get("/")).status_code == 403
        assert (await http.get("/", headers={"x-key": "sesame"})).status_code == 200


async def test_from_url_and_mounted_under_a_path(redis_url: str, prefix: str) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    dash = create_app(redis_url, prefix)
    outer = Starlette(routes=[Mount("/delayq", app=dash)])
    async with _client(outer) as http:
        r = await http.get("/delayq/")
        assert r.status_code == 200
        assert 'href="/delayq/static/style.css"' in r.text
        assert "delayq_csrf" in r.headers.get("set-cookie", "")
        assert "Path=/delayq" in r.headers["set-cookie"]
    await dash.state.service.aclose()


class Audited(Event, event_name="dash-audited"):
    """Delivered to the default group and to "audit"."""


async def _fails_a0(event: Audited) -> None:
    if event.id == "a0":
        raise RuntimeError("default says no")


async def _audit_fails(event: Audited) -> None:
    raise RuntimeError("audit says no")


async def test_groups_are_shown_and_dead_letter_actions_act_on_the_selected_group(
    setup, wait_for
) -> None:
    service, pool = setup
    evil = "<script>g</script>"
    worker = await pool.start(heartbeat_interval=0)
    # registered before the events are enqueued, so that both groups get them
    assert await worker.register_group(Audited, "audit")
    assert await worker.register_group(Audited, evil)  # no handler: its events wait
    worker.add_handler(Audited, _fails_a0)
    worker.add_handler(Audited, _audit_fails, group="audit")
    await service.enqueue_many([Audited(id="a0"), Audited(id="a1")])

    async def dead() -> bool:
        stats = await service.group_stats("dash-audited")
        return stats["default"].dead == 1 and stats["audit"].dead == 2

    await wait_for(dead, timeout=10)
    await worker.remove_handler(Audited)
    await worker.remove_handler(Audited, group="audit")

    def row(html: str, group: str) -> list[str]:
        part = html.split(f'class="group-row" data-group="{group}"')[1].split("</tr>")[0]
        return re.findall(r'<td class="n[^"]*"[^>]*>([\d,]+)</td>', part)

    async with _client(create_app(service)) as http:
        overview = await http.get("/")
        assert '<td class="n groups" data-label="groups">3</td>' in overview.text
        # the overview sums the groups' dead letters and flags the groups that need a look
        type_row = overview.text.split('data-type="dash-audited"')[1].split("</tr>")[0]
        assert re.search(r'data-label="dead">3</td>', type_row)
        assert 'data-flag="dead" data-group="audit"' in type_row and "audit: 2 dead" in type_row
        assert "default: 1 dead" in type_row
        # the group nobody handles has ready events and no live consumer
        assert 'data-flag="no-consumer" data-group="&lt;script&gt;g&lt;/script&gt;"' in type_row
        assert "2 ready, no live consumer" in type_row
        page = await http.get("/type", params={"name": "dash-audited"})
        assert page.status_code == 200
        assert "<script>g" not in page.text and "&lt;script&gt;g&lt;/script&gt;" in page.text
        # scheduled, ready, in flight, dead per group
        assert row(page.text, "default") == ["0", "0", "0", "1"]
        assert row(page.text, "audit") == ["0", "0", "0", "2"]
        assert row(page.text, "&lt;script&gt;g&lt;/script&gt;") == ["0", "2", "0", "0"]
        # the default group's dead letters unless another is selected
        assert 'data-id="a0"' in page.text and 'data-id="a1"' not in page.text
        page = await http.get("/type", params={"name": "dash-audited", "group": "audit"})
        assert 'data-id="a0"' in page.text and 'data-id="a1"' in page.text
        assert '<input type="hidden" name="group" value="audit">' in page.text
        assert (await http.get("/type", params={"name": "x", "group": "a{b}"})).status_code == 400
        token = _csrf(page.text)
        base = {"type": "dash-audited", "csrf": token, "action": "requeue"}
        # the group travels in the CSRF-checked form: a forged one does nothing
        r = await http.post("/actions/dead", data={**base, "csrf": "x" * 64, "group": "audit",
                                                   "id": "a0"})  # fmt: skip
        assert r.status_code == 403
        r = await http.post("/actions/dead", data={**base, "group": "audit", "id": "a0"})
        assert r.status_code == 200 and "Requeued 1 dead letter(s)" in r.text
        assert "group audit" in r.text and "group=audit" in r.text  # the back link keeps it
        r = await http.post("/actions/dead", data={**base, "group": "audit", "scope": "all"})
        assert "all 1 dead letters of dash-audited, group audit?" in r.text
        assert '<input type="hidden" name="group" value="audit">' in r.text
    assert [d.id for d in await service.dead_letters("dash-audited", group="audit")] == ["a1"]
    assert [d.id for d in await service.dead_letters("dash-audited")] == ["a0"]
    stats = await service.group_stats("dash-audited")
    assert stats["default"].dead == 1 and stats["audit"].dead == 1
    assert stats["audit"].scheduled + stats["audit"].ready == 1
    assert stats["default"].scheduled + stats["default"].ready + stats["default"].in_flight == 0


class Fanned(Event, event_name="dash-fanned"):
    """Handled by the default group, failed by "audit", held running by "slow"."""


async def test_in_flight_upcoming_charts_and_event_actions_per_group(setup, wait_for) -> None:
    import asyncio

    service, pool = setup
    evil = "<i>x</i>"
    worker = await pool.start(heartbeat_interval=0, history_interval=0.2)
    for group in ("audit", "slow", evil):
        assert await worker.register_group(Fanned, group)
    release = asyncio.Event()

    async def ok(event: Fanned) -> None:
        pass

    async def audit(event: Fanned) -> None:
        raise RuntimeError("audit says no")

    async def slow(event: Fanned) -> None:
        await release.wait()

    worker.add_handler(Fanned, ok)
    worker.add_handler(Fanned, audit, group="audit")
    worker.add_handler(Fanned, slow, group="slow")
    await service.enqueue_with_delay(Fanned(id="e1"), 0)
    await service.enqueue_with_delay(Fanned(id="f1"), 3600)

    async def placed() -> bool:
        s = await service.group_stats("dash-fanned")
        return s["audit"].dead == 1 and s["slow"].in_flight == 1 and s["default"].ready == 0

    await wait_for(placed, timeout=10)

    async def audit_history() -> bool:
        return sum(p.failed for p in await service.history("dash-fanned", group="audit")) == 1

    await wait_for(audit_history, timeout=10)
    try:
        async with _client(create_app(service)) as http:
            # the in-flight list of the selected group (the live fragment too)
            for path in ("/type", "/live/type"):
                page = await http.get(path, params={"name": "dash-fanned", "group": "slow"})
                assert page.status_code == 200
                assert 'class="in-flight-row" data-id="e1"' in page.text
                assert "in group slow" in page.text
            page = await http.get("/type", params={"name": "dash-fanned"})
            assert 'class="in-flight-row"' not in page.text  # the default group's: none
            assert 'data-live-url="/live/type?name=dash-fanned"' in page.text
            # audit's page: its upcoming events, its charts (1 failure), a run-now for audit
            page = await http.get("/type", params={"name": "dash-fanned", "group": "audit"})
            assert 'class="upcoming-row" data-id="f1"' in page.text
            assert '<input type="hidden" name="group" value="audit">' in page.text
            assert "(group audit)" in page.text and "group=audit" in page.text
            assert "/live/type?name=dash-fanned&amp;group=audit" in page.text
            assert (
                '<a href="/type?name=dash-fanned&amp;group=audit" data-group="audit" class="on"'
                in page.text
            )
            assert "&lt;i&gt;x&lt;/i&gt;" in page.text and "<i>x</i>" not in page.text
            page = await http.get("/type", params={"name": "dash-fanned", "group": "nobody"})
            assert page.status_code == 200 and 'id="no-such-group"' in page.text

            # the event page: each group's state and actions
            page = await http.get("/event", params={"type": "dash-fanned", "id": "e1"})
            assert page.status_code == 200 and "<i>x</i>" not in page.text

            def group_row(html: str, group: str) -> str:
                return html.split(f'class="event-group-row" data-group="{group}"')[1].split(
                    "</tr>"
                )[0]

            assert "state-dead" in group_row(page.text, "audit")
            assert "requeue-group" in group_row(page.text, "audit")
            assert "state-in_flight" in group_row(page.text, "slow")
            assert "done or not delivered" in group_row(page.text, "default")
            assert "state-ready" in group_row(page.text, "&lt;i&gt;x&lt;/i&gt;")
            assert 'id="event-state">in flight' in page.text  # the most active group's
            page = await http.get("/event", params={"type": "dash-fanned", "id": "f1"})
            assert "run-now-group" in group_row(page.text, "audit") and 'id="run-now"' in page.text
            token = _csrf(page.text)

            # run now for audit alone; a forged one (bad token) does nothing
            base = {"type": "dash-fanned", "id": "f1", "action": "run_now", "group": "audit"}
            r = await http.post("/actions/event", data={**base, "csrf": "x" * 64})
            assert r.status_code == 403
            assert (await service.inspect("dash-fanned", "f1")).state == "scheduled"
            r = await http.post("/actions/event", data={**base, "csrf": token})
            assert "Running now" in r.text and "of group audit" in r.text
            info = await service.inspect("dash-fanned", "f1")
            assert info.groups["default"].state == "scheduled"
            # handed to audit's handler, which fails it at once
            assert info.groups["audit"].state in ("ready", "in_flight", "dead")
            r = await http.post("/actions/event", data={**base, "csrf": token, "group": "a{b}"})
            assert r.status_code == 400

            # purge audit's dead letter from the event page: the other groups keep theirs
            r = await http.post(
                "/actions/dead",
                data={"type": "dash-fanned", "id": "e1", "action": "purge", "group": "audit",
                      "csrf": token},
            )  # fmt: skip
            assert "Yes, purge" in r.text  # even one dead letter: purging asks first
            assert (await service.inspect("dash-fanned", "e1")).groups["audit"].state == "dead"
            r = await http.post(
                "/actions/dead",
                data={"type": "dash-fanned", "id": "e1", "action": "purge", "group": "audit",
                      "csrf": token, "confirm": "yes"},
            )  # fmt: skip
            assert "Purged 1 dead letter(s)" in r.text
            info = await service.inspect("dash-fanned", "e1")
            assert info.groups["audit"].state == "absent"
            assert info.groups["slow"].state == "in_flight"

        # read-only: no per-group action, and posts are refused
        async with _client(create_app(service, read_only=True)) as http:
            page = await http.get("/event", params={"type": "dash-fanned", "id": "f1"})
            assert 'id="event-groups"' in page.text
            assert "run-now-group" not in page.text and 'id="run-now"' not in page.text
            r = await http.post("/actions/event", data={**base, "csrf": token})
            assert r.status_code == 403
    finally:
        release.set()


async def test_flow_card_and_pause_resume(setup) -> None:
    """The type page shows the limits and the paused state; pause and resume are CSRF-checked
    actions, refused in read-only mode."""
    service, _ = setup
    await service.enqueue_with_delay(Page(id="a"), 3600)
    await service.set_limits("dash-page", concurrency=3, rate="10/s")
    async with _client(create_app(service)) as http:
        page = await http.get("/type", params={"name": "dash-page"})
        assert 'id="limit-concurrency">3<' in page.text and "10/s burst 1" in page.text
        assert 'id="pause-btn"' in page.text
        token = _csrf(page.text)
        data = {"type": "dash-page", "action": "pause"}
        r = await http.post("/actions/flow", data={**data, "csrf": "x" * 64})
        assert r.status_code == 403
        assert not (await service.limits("dash-page")).paused
        r = await http.post("/actions/flow", data={**data, "csrf": token})
        assert r.status_code == 200 and "Paused" in r.text
        assert (await service.limits("dash-page")).paused
        page = await http.get("/type", params={"name": "dash-page"})
        assert 'id="resume-btn"' in page.text and ">paused<" in page.text
        overview = await http.get("/")  # a paused type's backlog grows: the overview says why
        row = overview.text.split('data-type="dash-page"')[1].split("</tr>")[0]
        assert 'data-flag="paused" data-group="default"' in row and ">paused</a>" in row
        r = await http.post("/actions/flow", data={**data, "action": "resume", "csrf": token})
        assert r.status_code == 200 and not (await service.limits("dash-page")).paused
        overview = await http.get("/")
        assert 'data-flag="paused"' not in overview.text
    async with _client(create_app(service, read_only=True)) as http:
        page = await http.get("/type", params={"name": "dash-page"})
        assert 'id="limit-concurrency"' in page.text and 'id="pause-btn"' not in page.text
        r = await http.post("/actions/flow", data={"type": "dash-page", "action": "pause",
                                                   "csrf": "x"})  # fmt: skip
        assert r.status_code == 403
    assert not (await service.limits("dash-page")).paused


async def test_waiting_children_show_their_count_and_parents(setup) -> None:
    service, _ = setup
    await service.enqueue_with_delay(Boom(id="parent"), 3600)
    assert await service.enqueue_with_delay(
        Page(id="child", text="t"), 0, after=[(Boom, "parent"), (Page, "never")]
    )
    async with _client(create_app(service)) as http:
        r = await http.get("/live/overview")
        assert r.status_code == 200
        row = r.text.split('data-type="dash-page"')[1].split("</tr>")[0]
        assert 'data-label="waiting">1<' in row
        r = await http.get("/live/type", params={"name": "dash-page"})
        assert 'id="waiting-count"' in r.text
        r = await http.get("/event", params={"type": "dash-page", "id": "child"})
        assert 'id="event-state">waiting<' in r.text
        parents = r.text.split('id="event-parents"')[1].split("</table>")[0]
        assert 'data-status="pending"' in parents and "parent" in parents
        assert 'data-status="missing"' in parents and "never" in parents
        assert 'id="cancel"' in r.text  # a waiting child can be cancelled


async def test_an_events_workflow_is_drawn_with_its_parents_and_children(setup) -> None:
    service, _ = setup
    await service.enqueue_with_delay(Boom(id="root<&>"), 3600)
    await service.enqueue_with_delay(Page(id="mid", text="t"), 0, after=[(Boom, "root<&>")])
    # more children than the graph draws: it says how many more
    many = [Page(id=f"kid-{n}", text="t") for n in range(53)]
    assert await service.enqueue_many(many, 0, after=[(Page, "mid")]) == [True] * 53
    async with _client(create_app(service)) as http:
        r = await http.get("/event", params={"type": "dash-page", "id": "mid"})
        assert r.status_code == 200
        svg = r.text.split('id="event-workflow"')[1].split("</svg>")[0]
        assert '<svg class="workflow"' in svg
        # its parent, escaped, with its status, linking to its page
        (parent,) = re.findall(r'<a class="node parent"[^>]*>', svg)
        assert 'href="/event?type=dash-boom&amp;id=root%3C%26%3E"' in parent
        assert 'data-state="pending"' in parent and "root&lt;&amp;&gt;" in svg
        assert "root<&>" not in svg
        # itself, and its children (50 drawn, 3 more) in their state
        assert len(re.findall(r'<a class="node self"[^>]*data-state="waiting"', svg)) == 1
        kids = re.findall(r'<a class="node child" href="([^"]*)" data-state="(\w+)"', svg)
        assert len(kids) == 50 and {s for _, s in kids} == {"waiting"}
        assert kids[0][0] == "/event?type=dash-page&amp;id=kid-0"
        assert "and 3 more children" in svg
        # a child's page: its parent on the left, no children
        r = await http.get("/event", params={"type": "dash-page", "id": "kid-7"})
        svg = r.text.split('id="event-workflow"')[1].split("</svg>")[0]
        assert 'class="node parent" href="/event?type=dash-page&amp;id=mid"' in svg
        assert 'class="node child"' not in svg
        # a plain event has no graph
        await service.enqueue_with_delay(Page(id="alone", text="t"), 3600)
        r = await http.get("/event", params={"type": "dash-page", "id": "alone"})
        assert r.status_code == 200 and 'id="event-workflow"' not in r.text
