"""The dashboard's Schedules page: escaping, CSRF-checked actions, read-only."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import timedelta

import httpx
import pytest

from delayq import Event, EventService
from delayq.dashboard import create_app


class Nightly(Event, event_name="dash-sched"):
    label: str = ""


@pytest.fixture
async def service(redis_url: str, prefix: str) -> AsyncIterator[EventService]:
    svc = EventService.from_url(
        redis_url, prefix=prefix, enable_scheduling=False, heartbeat_interval=0
    )
    yield svc
    await svc.aclose()


def _client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://dash.test")


def _csrf(html: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', html)
    assert match, "no CSRF field on the page"
    return match.group(1)


async def test_schedules_page_escapes_and_actions_need_csrf(service: EventService) -> None:
    evil = "<script>alert(1)</script>"
    await service.schedule(evil, Nightly, cron="0 3 * * *", timezone="Europe/Berlin")
    await service.schedule("every5", Nightly, every=timedelta(minutes=5))
    async with _client(create_app(service)) as http:
        page = await http.get("/schedules")
        assert page.status_code == 200
        assert evil not in page.text and "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text
        assert "0 3 * * *" in page.text and "Europe/Berlin" in page.text
        token = _csrf(page.text)
        for data, headers in (
            ({"name": "every5", "action": "pause"}, {}),
            ({"name": "every5", "action": "pause", "csrf": "x" * 64}, {}),
            ({"name": "every5", "action": "pause", "csrf": token}, {"origin": "http://evil.test"}),
        ):
            r = await http.post("/actions/schedule", data=data, headers=headers)
            assert r.status_code == 403
        info = await service.schedule_info("every5")
        assert info is not None and not info.paused
        ok = {"name": "every5", "csrf": token}
        r = await http.post("/actions/schedule", data={**ok, "action": "pause"})
        assert r.status_code == 303
        assert (await service.schedule_info("every5")).paused  # type: ignore[union-attr]
        r = await http.post("/actions/schedule", data={**ok, "action": "resume"})
        assert r.status_code == 303
        r = await http.post("/actions/schedule", data={**ok, "action": "trigger"})
        assert r.status_code == 303
        assert (await service.schedule_info("every5")).triggers == 1  # type: ignore[union-attr]
        r = await http.post("/actions/schedule", data={**ok, "action": "explode"})
        assert r.status_code == 400
        r = await http.post("/actions/schedule", data={**ok, "action": "remove"})
        assert r.status_code == 303
        assert await service.schedule_info("every5") is None
        r = await http.post("/actions/schedule", data={**ok, "action": "remove"})
        assert r.status_code == 404


async def test_read_only_hides_and_refuses_schedule_actions(service: EventService) -> None:
    await service.schedule("ro", Nightly, every=timedelta(minutes=5))
    async with _client(create_app(service, read_only=True)) as http:
        page = await http.get("/schedules")
        assert "ro" in page.text and "/actions/schedule" not in page.text
        r = await http.post(
            "/actions/schedule", data={"name": "ro", "action": "remove", "csrf": "x"}
        )
        assert r.status_code == 403
    assert await service.schedule_info("ro") is not None
