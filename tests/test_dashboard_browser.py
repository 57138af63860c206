"""The dashboard in a real browser: Debian's chromium driven by Selenium.

A real dashboard server (``python -m delayq.dashboard``) and real worker processes
(tests/dashboard_worker.py) run against a private Redis. Screenshots go to
``$DELAYQ_SCREENSHOTS`` (default: the test's tmp dir).

Skipped when /usr/bin/chromium or /usr/bin/chromedriver is missing (scripts/test.sh
installs them with apt). Selenium is given the driver and the browser, so
selenium-manager never downloads anything.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from delayq import Event, EventService

CHROMIUM = os.environ.get("DELAYQ_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("DELAYQ_CHROMEDRIVER", "/usr/bin/chromedriver")
HERE = Path(__file__).parent

pytestmark = pytest.mark.skipif(
    not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)),
    reason="needs Debian's chromium and chromium-driver (scripts/test.sh installs them)",
)


class UiJob(Event, event_name="ui-job"):
    """Same wire name and fields as tests/dashboard_worker.py's."""

    fail: bool = False
    note: str = ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(predicate, timeout: float = 15.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    where = Path(os.environ.get("DELAYQ_SCREENSHOTS") or tmp_path / "screenshots")
    where.mkdir(parents=True, exist_ok=True)
    return where


class Procs:
    """Child processes of a test, stopped at the end."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, *args], cwd=HERE.parent)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def procs() -> Iterator[Procs]:
    p = Procs()
    try:
        yield p
    finally:
        p.close()


def _dashboard(procs: Procs, url: str, prefix: str, *extra: str) -> str:
    port = _free_port()
    procs.start(
        "-m", "delayq", "dashboard", "--redis-url", url, "--prefix", prefix,
        "--port", str(port), "--refresh", "1", *extra,
    )  # fmt: skip

    def up() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            return False

    _wait(up, what="the dashboard server")
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def browser() -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # selenium-manager: never fetch anything
    profile = tempfile.mkdtemp(prefix="delayq-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1280,1000",
    ):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()
        subprocess.run(["rm", "-rf", profile], check=False)


def _sync(url: str, prefix: str) -> tuple[redis.Redis, EventService]:
    return redis.Redis.from_url(url, protocol=2), EventService.from_url(url, prefix=prefix)


async def _enqueue(url: str, prefix: str, jobs: list[tuple[UiJob, float]]) -> None:
    service = EventService.from_url(url, prefix=prefix)
    try:
        for job, delay in jobs:
            await service.enqueue_with_delay(job, delay)
    finally:
        await service.aclose()


async def _enqueue_child(url: str, prefix: str, child: UiJob, parent_id: str) -> None:
    """``child`` waiting for the ui-job ``parent_id`` (after=[...])."""
    service = EventService.from_url(url, prefix=prefix)
    try:
        assert await service.enqueue_with_delay(child, 0, after=[(UiJob, parent_id)])
    finally:
        await service.aclose()


def _run(coro):
    import asyncio

    return asyncio.run(coro)


def _css(driver, selector: str):
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, selector)


def _click(driver, selector: str, timeout: float = 10.0) -> None:
    """Click the first element matching ``selector``, found again if the page's live
    refresh replaced it between the look and the click (a loaded CI lane hit that)."""
    from selenium.common.exceptions import StaleElementReferenceException

    def clicked() -> bool:
        found = _css(driver, selector)
        if not found:
            return False
        try:
            found[0].click()
        except StaleElementReferenceException:
            return False
        return True

    _wait(clicked, timeout, f"a click on {selector!r}")


def _find(driver, selector: str, timeout: float = 10.0):
    """The first element matching ``selector`` once the page shows one (a click's
    navigation may still be under way when click() returns)."""
    return _wait(lambda: _css(driver, selector), timeout, f"{selector!r} on the page")[0]


def test_requeue_a_dead_letter_and_a_worker_handles_it(
    redis_url: str, prefix: str, procs: Procs, browser, shots: Path
) -> None:
    from selenium.webdriver.common.by import By

    raw = redis.Redis.from_url(redis_url, protocol=2)
    procs.start(str(HERE / "dashboard_worker.py"), redis_url, prefix)
    _wait(lambda: raw.scard(f"{prefix}-test:ready"), what="the worker")
    _run(_enqueue(redis_url, prefix, [
        (UiJob(id="broken-1", fail=True, note="<script>alert('x')</script>"), 0),
        (UiJob(id="fine-1"), 0),
        *[(UiJob(id=f"later-{i}"), 60 * (i + 1) ** 2) for i in range(8)],
    ]))  # fmt: skip
    _wait(lambda: raw.zcard(f"{{{prefix}:ui-job}}:dead") == 1, what="the dead letter")
    _wait(lambda: raw.sismember(f"{prefix}-test:handled", "fine-1"), what="fine-1 handled")
    base = _dashboard(procs, redis_url, prefix)

    browser.get(base + "/")
    assert "ui-job" in browser.find_element(By.CSS_SELECTOR, "table.types").text
    browser.save_screenshot(str(shots / "overview.png"))
    _click(browser, "a.type-link")
    _wait(lambda: "broken-1" in browser.page_source, what="the type page")
    browser.save_screenshot(str(shots / "type.png"))
    # the dead letter's page shows the payload as text, not as markup
    _click(browser, "tr.dead-row a.event-link")
    payload = _find(browser, "#payload").text
    assert "<script>alert('x')</script>" in payload
    assert browser.find_element(By.ID, "event-state").text == "dead"
    browser.save_screenshot(str(shots / "event.png"))
    raw.set(f"{prefix}-test:fixed", 1)  # the fix is deployed
    _click(browser, "#requeue")
    assert "Requeued 1 dead letter" in _find(browser, "#result").text
    _wait(lambda: raw.sismember(f"{prefix}-test:handled", "broken-1"), what="the requeued job")
    _click(browser, "#back")
    _find(browser, "#dead")
    assert not _css(browser, "tr.dead-row")
    raw.close()


class UiGrouped(Event, event_name="ui-grouped"):
    """Handled by the default group, failed by the "audit" group."""


async def _audit_dead_letter(url: str, prefix: str) -> None:
    """Make one dead letter of group "audit" (the default group handles the event)."""
    import asyncio

    from core_support import ServicePool

    async def ok(event: UiGrouped) -> None:
        pass

    async def audit(event: UiGrouped) -> None:
        raise RuntimeError("audit is down")

    pool = ServicePool(url, prefix, retry_attempts=0)
    try:
        service = await pool.start(heartbeat_interval=0)
        assert await service.register_group(UiGrouped, "audit")  # before the event is enqueued
        service.add_handler(UiGrouped, ok)
        service.add_handler(UiGrouped, audit, group="audit")
        await service.enqueue_many([UiGrouped(id="g-1")])
        for _ in range(300):
            stats = await service.group_stats(UiGrouped)
            done = stats["default"].in_flight == stats["default"].ready == 0
            if stats["audit"].dead == 1 and done:
                return
            await asyncio.sleep(0.05)
        pytest.fail("no dead letter in group audit")
    finally:
        await pool.aclose()


def test_requeue_a_dead_letter_of_a_delivery_group(
    redis_url: str, prefix: str, procs: Procs, browser, shots: Path
) -> None:
    _run(_audit_dead_letter(redis_url, prefix))
    base = _dashboard(procs, redis_url, prefix)
    browser.get(base + "/type?name=ui-grouped")
    groups = [r.get_attribute("data-group") for r in _css(browser, "#groups tr.group-row")]
    assert groups == ["audit", "default"]
    assert not _css(browser, "tr.dead-row")  # the default group has none
    _click(browser, '#group-select a[data-group="audit"]')
    _find(browser, 'tr.dead-row[data-id="g-1"]')
    browser.save_screenshot(str(shots / "groups.png"))
    _click(browser, "button.requeue-one")
    assert "Requeued 1 dead letter" in _find(browser, "#result").text
    _click(browser, "#back")
    _find(browser, '#group-select a.on[data-group="audit"]')
    assert not _css(browser, "tr.dead-row")

    async def check() -> None:
        service = EventService.from_url(redis_url, prefix=prefix)
        try:
            stats = await service.group_stats("ui-grouped")
            assert stats["audit"].dead == 0 and stats["audit"].scheduled + stats["audit"].ready == 1
            assert stats["default"].dead == 0
            assert stats["default"].scheduled + stats["default"].ready == 0
        finally:
            await service.aclose()

    _run(check())


class UiFanned(Event, event_name="ui-fanned"):
    """Same wire name as tests/dashboard_worker.py's (delivered to three groups there)."""


async def _enqueue_fanned(url: str, prefix: str, items: list[tuple[str, float]]) -> None:
    service = EventService.from_url(url, prefix=prefix)
    try:
        for event_id, delay in items:
            await service.enqueue_with_delay(UiFanned(id=event_id), delay)
    finally:
        await service.aclose()


def test_group_selector_in_flight_and_event_actions_per_group(
    redis_url: str, prefix: str, procs: Procs, browser, shots: Path
) -> None:
    """The group selector picks the in-flight and upcoming lists; the event page shows
    each group's state and runs or requeues it in one group."""
    raw = redis.Redis.from_url(redis_url, protocol=2)
    tag = f"{{{prefix}:ui-fanned}}"
    procs.start(str(HERE / "dashboard_worker.py"), redis_url, prefix, "--groups")
    _wait(lambda: raw.scard(f"{prefix}-test:ready"), what="the worker")
    _run(_enqueue_fanned(redis_url, prefix, [("fan-1", 0), ("fan-later", 3600)]))
    _wait(lambda: raw.zcard(f"{tag}:g:audit:dead") == 1, what="audit's dead letter")
    _wait(lambda: raw.zcard(f"{tag}:g:slow:inflight") == 1, what="slow's running handler")
    _wait(lambda: raw.sismember(f"{prefix}-test:handled", "default:fan-1"), what="default")
    base = _dashboard(procs, redis_url, prefix)
    try:
        browser.get(base + "/type?name=ui-fanned")
        assert not _css(browser, "tr.in-flight-row")  # the default group runs nothing
        _click(browser, '#group-select a[data-group="slow"]')
        _find(browser, 'tr.in-flight-row[data-id="fan-1"]')
        assert _css(browser, '#group-select a.on[data-group="slow"]')
        browser.save_screenshot(str(shots / "group-in-flight.png"))
        _click(browser, '#group-select a[data-group="audit"]')
        _find(browser, '#group-select a.on[data-group="audit"]')
        assert _css(browser, 'tr.upcoming-row[data-id="fan-later"]')
        assert _css(browser, 'tr.dead-row[data-id="fan-1"]')

        # the event page: run the later event now for audit alone
        browser.get(base + "/event?type=ui-fanned&id=fan-later")
        states = {
            r.get_attribute("data-group"): r.find_element("css selector", ".state").text
            for r in _css(browser, "tr.event-group-row")
        }
        assert states == {"audit": "scheduled", "default": "scheduled", "slow": "scheduled"}
        browser.save_screenshot(str(shots / "event-groups.png"))
        _click(browser, 'tr.event-group-row[data-group="audit"] button.run-now-group')
        result = _find(browser, "#result").text
        assert result == "Running now", result
        _wait(lambda: raw.zcard(f"{tag}:g:audit:dead") == 2, what="audit failing it again")
        assert raw.zscore(f"{tag}:g:default:scheduled", "fan-later") is not None  # not run

        # requeue audit's dead letter of fan-1 from its event page, once audit is fixed
        raw.set(f"{prefix}-test:fixed", 1)
        browser.get(base + "/event?type=ui-fanned&id=fan-1")
        _click(browser, 'tr.event-group-row[data-group="audit"] button.requeue-group')
        assert "Requeued 1 dead letter" in _find(browser, "#result").text
        _wait(lambda: raw.sismember(f"{prefix}-test:handled", "audit:fan-1"), what="requeued")
        assert not raw.sismember(f"{prefix}-test:handled", "default:fan-later")
    finally:
        raw.set(f"{prefix}-test:release", 1)
        raw.close()


def test_search_cancel_and_run_now(
    redis_url: str, prefix: str, procs: Procs, browser, shots: Path
) -> None:
    from selenium.webdriver.common.by import By

    _run(_enqueue(redis_url, prefix, [(UiJob(id="find-me"), 3600), (UiJob(id="drop-me"), 7200)]))
    base = _dashboard(procs, redis_url, prefix)
    browser.get(base + "/")
    box = browser.find_element(By.ID, "search-id")
    box.send_keys("find-me")
    box.submit()
    _wait(lambda: _css(browser, "#event-state"), what="the event page")
    assert browser.find_element(By.ID, "event-state").text == "scheduled"
    assert browser.find_element(By.CSS_SELECTOR, ".event-id").text == "find-me"
    # a child's workflow graph renders, and its parent's box opens the parent's page
    _run(_enqueue_child(redis_url, prefix, UiJob(id="find-me-after"), "find-me"))
    browser.get(base + "/event?type=ui-job&id=find-me-after")
    graph = _find(browser, "#event-workflow svg.workflow")
    assert graph.size["width"] > 200 and graph.size["height"] > 20
    parent = _find(browser, '#event-workflow a.node.parent[data-state="pending"] rect')
    assert parent.size["width"] > 50
    parent.click()
    _wait(
        lambda: browser.find_element(By.CSS_SELECTOR, ".event-id").text == "find-me",
        10,
        "the parent's page",
    )
    assert _find(browser, "#event-workflow a.node.child")  # the child, from the parent's page
    browser.get(base + "/event?type=ui-job&id=drop-me")
    _click(browser, "#cancel")
    _find(browser, "#confirm")  # cancelling asks first
    raw = redis.Redis.from_url(redis_url, protocol=2)
    assert raw.zscore(f"{{{prefix}:ui-job}}:scheduled", "drop-me") is not None
    raw.close()
    _click(browser, "#confirm")
    assert _find(browser, "#result").text == "Cancelled"
    browser.get(base + "/type?name=ui-job")
    ids = [r.get_attribute("data-id") for r in _css(browser, "tr.upcoming-row")]
    assert ids == ["find-me"]
    browser.get(base + "/event?type=ui-job&id=nobody")
    assert _css(browser, "#not-found")


def test_read_only_shows_no_action_and_refuses_posts(
    redis_url: str, prefix: str, procs: Procs, browser
) -> None:
    from selenium.webdriver.common.by import By

    _run(_enqueue(redis_url, prefix, [(UiJob(id="keep-me"), 3600)]))
    base = _dashboard(procs, redis_url, prefix, "--read-only")
    browser.get(base + "/type?name=ui-job")
    assert "read-only" in browser.find_element(By.CSS_SELECTOR, "header").text
    assert not _css(browser, "main form[method=post]")
    browser.get(base + "/event?type=ui-job&id=keep-me")
    assert not _css(browser, "main form[method=post]")
    # a POST made by a script on the page itself (same origin) is still refused
    status = browser.execute_async_script(
        """const done = arguments[arguments.length - 1];
        fetch('/actions/event', {method: 'POST', body: new URLSearchParams(
            {type: 'ui-job', id: 'keep-me', action: 'cancel', csrf: 'x'})})
          .then(r => done(r.status));"""
    )
    assert status == 403
    raw = redis.Redis.from_url(redis_url, protocol=2)
    assert raw.zscore(f"{{{prefix}:ui-job}}:scheduled", "keep-me") is not None
    raw.close()


def test_forged_post_without_csrf_is_refused(
    redis_url: str, prefix: str, procs: Procs, browser, tmp_path: Path
) -> None:

    _run(_enqueue(redis_url, prefix, [(UiJob(id="target"), 3600)]))
    base = _dashboard(procs, redis_url, prefix)
    browser.get(base + "/")  # the victim has a session (the CSRF cookie)
    # an attacker's page, from another origin, posts a form without the token
    evil = tmp_path / "evil.html"
    evil.write_text(
        f'<form id="f" method="post" action="{base}/actions/event">'
        '<input name="type" value="ui-job"><input name="id" value="target">'
        '<input name="action" value="cancel"></form>'
        "<script>document.getElementById('f').submit()</script>"
    )
    browser.get(evil.as_uri())
    _wait(lambda: browser.current_url.startswith(base), what="the forged POST")
    assert "Refused" in _find(browser, "h1").text
    raw = redis.Redis.from_url(redis_url, protocol=2)
    assert raw.zscore(f"{{{prefix}:ui-job}}:scheduled", "target") is not None
    raw.close()


def test_a_killed_worker_leaves_the_workers_page_after_its_ttl(
    redis_url: str, prefix: str, procs: Procs, browser, shots: Path
) -> None:
    from selenium.webdriver.common.by import By

    raw = redis.Redis.from_url(redis_url, protocol=2)
    keep = procs.start(str(HERE / "dashboard_worker.py"), redis_url, prefix, "--heartbeat", "0.3")
    victim = procs.start(str(HERE / "dashboard_worker.py"), redis_url, prefix, "--heartbeat", "0.3")
    _wait(lambda: raw.scard(f"{prefix}-test:ready") == 2, what="two workers")
    base = _dashboard(procs, redis_url, prefix)

    def rows() -> list[str]:
        browser.get(base + "/workers")
        return [r.text for r in _css(browser, "tr.worker-row")]

    listed = _wait(lambda: len(rows()) == 2 and rows(), what="two workers listed")
    assert any(f" {victim.pid} " in f" {r} " for r in listed)
    assert "ui-job (4)" in browser.find_element(By.ID, "workers").text
    browser.save_screenshot(str(shots / "workers.png"))
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    left = _wait(lambda: len(rows()) == 1 and rows(), timeout=10, what="the killed worker to go")
    assert f" {keep.pid} " in f" {left[0]} "
    raw.close()
