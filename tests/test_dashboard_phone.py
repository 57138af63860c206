"""The dashboard in a real browser at a phone's size (390×844), and live refresh that
keeps still under the pointer. Debian's chromium driven by Selenium, as in
tests/test_dashboard_browser.py (whose fixtures and helpers this module uses)."""

from __future__ import annotations

from pathlib import Path

import redis
from test_dashboard_browser import (  # noqa: F401  (fixtures)
    HERE,
    UiJob,
    _click,
    _dashboard,
    _enqueue,
    _enqueue_child,
    _enqueue_fanned,
    _find,
    _run,
    _wait,
    browser,
    procs,
    pytestmark,
    shots,
)

# Every visible control (link, button, field) as its line boxes; reports controls that
# overlap another or stick out of the viewport, and whether the page scrolls sideways.
_LAYOUT = """
const root = document.documentElement;
const width = root.clientWidth;
const boxes = [];
for (const el of document.querySelectorAll('a, button, input, select, textarea')) {
  if (el.closest('svg') || el.type === 'hidden') continue;
  const style = getComputedStyle(el);
  if (style.visibility === 'hidden' || style.display === 'none') continue;
  for (const r of el.getClientRects()) {
    if (r.width < 1 || r.height < 1) continue;
    boxes.push({el, r, name: (el.id || el.className || el.tagName) + ' ' + (el.textContent || el.value || '').trim().slice(0, 30)});
  }
}
const overlaps = [];
for (let i = 0; i < boxes.length; i++) {
  for (let j = i + 1; j < boxes.length; j++) {
    const a = boxes[i], b = boxes[j];
    if (a.el === b.el || a.el.contains(b.el) || b.el.contains(a.el)) continue;
    const w = Math.min(a.r.right, b.r.right) - Math.max(a.r.left, b.r.left);
    const h = Math.min(a.r.bottom, b.r.bottom) - Math.max(a.r.top, b.r.top);
    if (w > 1 && h > 1) overlaps.push(a.name + ' / ' + b.name);
  }
}
const outside = boxes.filter(b => b.r.left < -1 || b.r.right > width + 1).map(b => b.name);
const cells = [...document.querySelectorAll('td')].filter(td => {
  const r = td.getBoundingClientRect();
  return r.width > 0 && (r.left < -1 || r.right > width + 1);
}).map(td => (td.className || 'td') + ' ' + td.textContent.trim().slice(0, 20));
return {scrollWidth: root.scrollWidth, clientWidth: width, overlaps, outside, cells};
"""


def _check_layout(driver, what: str) -> None:
    found = driver.execute_script(_LAYOUT)
    assert found["scrollWidth"] <= found["clientWidth"], (what, found)
    assert not found["overlaps"], (what, found["overlaps"])
    assert not found["outside"], (what, found["outside"])
    assert not found["cells"], (what, found["cells"])


LONG = "invoice-2026-11-25-customer-0001234567-retry-" + "x" * 20


def test_every_page_fits_a_phone(
    redis_url: str,
    prefix: str,
    procs,
    browser,
    shots: Path,
) -> None:
    raw = redis.Redis.from_url(redis_url, protocol=2)
    tag = f"{{{prefix}:ui-fanned}}"
    procs.start(str(HERE / "dashboard_worker.py"), redis_url, prefix, "--groups")
    _wait(lambda: raw.scard(f"{prefix}-test:ready"), what="the worker")
    _run(_enqueue_fanned(redis_url, prefix, [("fan-1", 0), ("fan-later", 3600)]))
    _run(_enqueue(redis_url, prefix, [
        (UiJob(id=LONG, fail=True), 0), (UiJob(id="broken-2", fail=True), 0),
        *[(UiJob(id=f"later-{i}"), 60 * (i + 1)) for i in range(3)],
    ]))  # fmt: skip
    _run(_enqueue_child(redis_url, prefix, UiJob(id=LONG + "-child"), "later-0"))
    _wait(lambda: raw.zcard(f"{tag}:g:audit:dead") == 1, what="audit's dead letter")
    _wait(lambda: raw.zcard(f"{{{prefix}:ui-job}}:dead") == 2, what="the dead letters")
    base = _dashboard(procs, redis_url, prefix)
    browser.set_window_size(390, 844)
    width = browser.execute_script("return window.innerWidth")
    assert 370 <= width <= 400, width
    try:
        pages = {
            "overview": "/",
            "overview-day": "/?window=day",
            "type": "/type?name=ui-job",
            "type-group": "/type?name=ui-fanned&group=audit",
            "type-filter": "/type?name=ui-job&error=cannot",
            "event-groups": "/event?type=ui-fanned&id=fan-1",
            "event-dead": f"/event?type=ui-job&id={LONG}",
            "event-workflow": f"/event?type=ui-job&id={LONG}-child",
            "event-workflow-parent": "/event?type=ui-job&id=later-0",
            "workers": "/workers",
            "search": "/event",
            "prefix": "/event?id=later-",
        }
        for what, path in pages.items():
            browser.get(base + path)
            _find(browser, "footer")
            browser.save_screenshot(str(shots / f"phone-{what}.png"))
            _check_layout(browser, what)
        # and the same pages on a laptop's screen
        browser.set_window_size(1366, 900)
        for what, path in pages.items():
            browser.get(base + path)
            _find(browser, "footer")
            _check_layout(browser, f"{what} at 1366 px")
        browser.set_window_size(390, 844)
        # the overview's dead column is on screen, and the dead letters' ids read as ids
        browser.get(base + "/")
        dead = _find(browser, 'tr[data-type="ui-job"] td.dead')
        assert dead.is_displayed() and dead.text == "2"
        browser.get(base + "/type?name=ui-job")
        link = _find(browser, f'tr.dead-row[data-id="{LONG}"] a.event-link')
        lines = browser.execute_script("return arguments[0].getClientRects().length", link)
        assert lines <= 2, lines  # not one character per line
        button = _find(browser, f'tr.dead-row[data-id="{LONG}"] button.requeue-one')
        assert button.size["width"] >= 40 and button.is_displayed()
        # confirmation pages too
        _click(browser, "#purge-all-btn")
        _find(browser, "#confirm")
        _check_layout(browser, "confirm")
        browser.get(base + "/type?name=ui-job")
        _click(browser, "tr.upcoming-row button.cancel")
        _find(browser, "#confirm")
        _check_layout(browser, "confirm-cancel")
    finally:
        raw.set(f"{prefix}-test:release", 1)
        raw.close()


def _upcoming(driver) -> list[str]:
    # read in one script: a refresh may replace the rows between two WebDriver calls
    return driver.execute_script(
        "return [...document.querySelectorAll('tr.upcoming-row')].map(r => r.dataset.id)"
    )


def test_live_refresh_waits_while_the_pointer_is_on_a_list(
    redis_url: str,
    prefix: str,
    procs,
    browser,
) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    _run(_enqueue(redis_url, prefix, [(UiJob(id=f"row-{i}"), 600 + i) for i in range(5)]))
    base = _dashboard(procs, redis_url, prefix)  # refreshes every second
    browser.get(base + "/type?name=ui-job")
    live = _find(browser, "#type-live")
    row = _find(browser, 'tr.upcoming-row[data-id="row-0"]')
    ActionChains(browser).move_to_element(row).perform()
    _wait(lambda: live.get_attribute("data-live-paused"), what="a refresh held back")
    # an event due before all others arrives; a tick passes while the pointer stays
    _run(_enqueue(redis_url, prefix, [(UiJob(id="row-new"), 60)]))
    browser.execute_script("arguments[0].removeAttribute('data-live-paused')", live)
    _wait(lambda: live.get_attribute("data-live-paused"), what="another refresh held back")
    ids = _upcoming(browser)
    assert ids[0] == "row-0" and "row-new" not in ids
    assert row.is_displayed()  # the very element under the pointer is still there
    # the pointer leaves the list: the next refresh shows the new event
    ActionChains(browser).move_to_element(_find(browser, "header .brand")).perform()
    _wait(lambda: _upcoming(browser)[:1] == ["row-new"], what="the refresh once the pointer left")
    assert not live.get_attribute("data-live-paused")
