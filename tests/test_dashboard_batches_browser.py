"""The batch pages in a real browser: Debian's chromium driven by Selenium, a real
dashboard server and a real worker (tests/dashboard_worker.py), as in
tests/test_dashboard_browser.py (whose fixtures and helpers this module uses).

The nav leads to the batches, the list to a batch, whose progress bar shows succeeded,
failed and pending members in proportion; its failed member's link opens that member's
dead letter, which links back; a member run now finishes the batch and the page's live
refresh shows it done; the callback's page and its workflow graph lead to the batch.
The pages also fit a phone's screen.
"""

from __future__ import annotations

from pathlib import Path

import redis
from test_dashboard_browser import (  # noqa: F401  (fixtures)
    HERE,
    UiJob,
    _click,
    _dashboard,
    _find,
    _run,
    _wait,
    browser,
    procs,
    pytestmark,
    shots,
)
from test_dashboard_phone import _check_layout

from delayq import Event, EventService


class UiCallback(Event, event_name="ui-batch-callback"):
    """The batch's on_complete: nobody handles it, so its page stays to be looked at."""


async def _open_batch(url: str, prefix: str) -> str:
    """A batch of three ui-jobs: one handled, one failing, one due in an hour."""
    service = EventService.from_url(url, prefix=prefix, enable_scheduling=False)
    try:
        async with service.batch(
            on_complete=UiCallback(id="import-done"), name="import <b>7</b>"
        ) as batch:
            await batch.enqueue_many([UiJob(id="row-ok"), UiJob(id="row-bad", fail=True)])
            await batch.enqueue_with_delay(UiJob(id="row-later"), 3600)
        return batch.id
    finally:
        await service.aclose()


def test_the_batch_page_from_the_nav_to_done(
    redis_url: str, prefix: str, procs, browser, shots: Path
) -> None:
    from selenium.webdriver.common.by import By

    raw = redis.Redis.from_url(redis_url, protocol=2)
    procs.start(str(HERE / "dashboard_worker.py"), redis_url, prefix)
    _wait(lambda: raw.scard(f"{prefix}-test:ready"), what="the worker")
    batch_id = _run(_open_batch(redis_url, prefix))
    _wait(lambda: raw.zcard(f"{{{prefix}:ui-job}}:dead") == 1, what="the failed member")
    _wait(lambda: raw.sismember(f"{prefix}-test:handled", "row-ok"), what="row-ok handled")
    base = _dashboard(procs, redis_url, prefix)
    try:
        browser.get(base + "/")
        _click(browser, "#nav-batches")
        row = _find(browser, f'tr.batch-row[data-id="{batch_id}"]')
        assert row.get_attribute("data-state") == "waiting"
        assert "import <b>7</b>" in row.text  # the name as text, not markup
        browser.save_screenshot(str(shots / "batches.png"))
        _click(browser, "a.batch-link")

        def counted() -> bool:  # the relay hands both completions to the batch
            browser.refresh()
            found = _css_text(browser, "#batch-succeeded", "#batch-failed")
            return found == ["1", "1"]

        _wait(counted, 15, "one member ok and one failed")
        assert browser.find_element(By.ID, "batch-state").text == "waiting"
        bar = _find(browser, "#batch-progress svg.progress")
        assert bar.size["width"] > 300 and bar.size["height"] >= 10
        widths = {
            css: browser.find_element(By.CSS_SELECTOR, f"#batch-progress rect.{css}").size["width"]
            for css in ("ok", "bad", "pending")
        }
        third = bar.size["width"] / 3
        assert all(abs(w - third) <= 2 for w in widths.values()), (widths, bar.size)
        browser.save_screenshot(str(shots / "batch-waiting.png"))

        # the failed member: its dead letter's page, which links back to the batch
        _click(browser, "#batch-failed-members a.member-link")
        _wait(lambda: _css_text(browser, ".event-id") == ["row-bad"], what="row-bad's page")
        assert browser.find_element(By.ID, "event-state").text == "dead"
        _click(browser, "#event-batch")
        _find(browser, "#batch-progress")
        # the member it waits on: its page links back too; once it runs (run now, here by
        # the library) the batch page, refreshed live, shows the batch done
        _click(browser, "#batch-waiting-on a.member-link")
        _wait(lambda: _css_text(browser, ".event-id") == ["row-later"], what="row-later's page")
        _click(browser, "#event-batch")
        _find(browser, "#batch-live[data-live-url]")
        page = browser.current_url
        assert _run(_run_now(redis_url, prefix, "row-later"))
        _wait(lambda: raw.sismember(f"{prefix}-test:handled", "row-later"), what="row-later")
        assert browser.current_url == page
        _wait(lambda: _css_text(browser, "#batch-state") == ["done"], 15, "the live refresh")
        assert not _css(browser, "#batch-waiting-on")
        browser.save_screenshot(str(shots / "batch-done.png"))

        # the callback: its page says whose it is; its graph's parent box opens the batch
        _click(browser, "#batch-on-complete")
        _wait(lambda: _css_text(browser, ".event-id") == ["import-done"], what="the callback")
        assert _css(browser, f'a.after-batch[href$="{batch_id}"]')
        _find(browser, '#event-workflow a.node.parent[data-state="failed"]').click()
        _wait(lambda: _css_text(browser, "#batch-id") == [batch_id], what="back to the batch")

        # a phone's screen and a laptop's: nothing scrolls sideways, nothing overlaps
        for width, height in ((390, 844), (1366, 900)):
            browser.set_window_size(width, height)
            for what, path in (("batches", "/batches"), ("batch", f"/batch?id={batch_id}")):
                browser.get(base + path)
                _find(browser, "footer")
                browser.save_screenshot(str(shots / f"{what}-{width}.png"))
                _check_layout(browser, f"{what} at {width} px")
    finally:
        raw.close()


def _css(driver, selector: str):
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, selector)


def _css_text(driver, *selectors: str) -> list[str]:
    """The text of the first element matching each selector (those found)."""
    from selenium.common.exceptions import StaleElementReferenceException

    out = []
    for selector in selectors:
        found = _css(driver, selector)
        try:
            if found:
                out.append(found[0].text)
        except StaleElementReferenceException:  # replaced by the live refresh meanwhile
            return []
    return out


async def _run_now(url: str, prefix: str, event_id: str) -> bool:
    service = EventService.from_url(url, prefix=prefix, enable_scheduling=False)
    try:
        return await service.run_now(UiJob, event_id)
    finally:
        await service.aclose()
