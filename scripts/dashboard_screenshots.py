"""Screenshots of the dashboard for the docs: ``python scripts/dashboard_screenshots.py [OUT_DIR]``.

Starts a private redis-server, fills it with a plausible day of three event types
(scheduled events over the next days, a ready backlog, handlers in flight, dead
letters, and a day of history), serves the dashboard and photographs it with
Debian's headless chromium (``/usr/bin/chromium`` + ``/usr/bin/chromedriver``).
Writes dashboard-overview.png, dashboard-type.png and dashboard-phone.png
(default OUT_DIR: docs/img).

The history is written straight into the rings (delayq.runtime.history's layout) because
a real one takes a day to collect; everything else goes through the public API.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import msgspec
import uvicorn

from delayq import Event, EventService
from delayq.dashboard import create_app
from delayq.runtime.history import COARSE_SECONDS, COARSE_SLOTS, LATENESS_BOUNDS_MS, MINUTE_SLOTS
from delayq.testing import RedisServer

PREFIX = "shop"


class PaymentCheck(Event, event_name="payment-check"):
    """Check that an order was paid."""

    order_id: int = 0
    amount_cents: int = 0


class EmailReminder(Event, event_name="email-reminder"):
    """Remind a customer of an abandoned cart."""

    email: str = ""
    cart: list[str] = []


class InvoiceSync(Event, event_name="invoice-sync"):
    """Push an invoice to the billing system."""

    invoice: str = ""


async def _fail(event: InvoiceSync) -> None:
    raise ConnectionError(f"billing API answered 502 Bad Gateway for {event.invoice}")


async def _slow(event: PaymentCheck) -> None:
    await asyncio.sleep(3600)


def _history(raw_redis, name: str, scale: float, fail_rate: float) -> None:
    """A smooth day of traffic, in delayq.runtime.history's ring layout."""
    rng = random.Random(name)
    now = time.time()
    pack = msgspec.msgpack.encode
    for ring, period, slots in (
        ("minute", 60, MINUTE_SLOTS),
        ("coarse", COARSE_SECONDS, COARSE_SLOTS),
    ):
        current = int(now // period)
        fields = {}
        for index in range(current - slots + 1, current + 1):
            hour = (index * period / 3600) % 24
            rate = (
                scale
                * (1.2 + math.sin((hour - 8) / 24 * 2 * math.pi))
                * (0.85 + 0.3 * rng.random())
            )
            handled = int(rate * period / 60)
            failed = int(handled * fail_rate * rng.random() * 2)
            buckets = [0] * (len(LATENESS_BOUNDS_MS) + 1)
            for _ in range(min(handled, 400)):
                ms = rng.lognormvariate(math.log(18 + 40 * (rate / scale > 1.8)), 1.0)
                buckets[sum(1 for b in LATENESS_BOUNDS_MS if b < ms)] += 1
            fields[str(index % slots)] = pack([index, handled, failed, *buckets])
        raw_redis.hset(f"{{{PREFIX}}}:history:{ring}:{name}", mapping=fields)


async def seed(url: str) -> EventService:
    rng = random.Random(7)
    producer = EventService.from_url(url, prefix=PREFIX)
    await producer.enqueue_many(
        [(PaymentCheck(id=f"order-{40000 + i}", order_id=40000 + i, amount_cents=rng.randrange(500, 90000)),
          rng.expovariate(1 / 5000) + 5) for i in range(2400)]
    )  # fmt: skip
    await producer.enqueue_many(
        [(EmailReminder(id=f"cart-{i:05d}", email=f"user{i}@example.com", cart=["sku-1", "sku-7"]),
          rng.uniform(30, 3 * 86400)) for i in range(700)]
    )  # fmt: skip
    await producer.enqueue_many(
        [InvoiceSync(id=f"inv-2026-{i:04d}", invoice=f"INV-{i:04d}") for i in range(9)]
    )
    await producer.enqueue_many([(InvoiceSync(id=f"inv-2026-{i:04d}", invoice=f"INV-{i:04d}"), 600 + 60 * i)
                                 for i in range(20, 60)])  # fmt: skip
    # a worker that fails every invoice (dead letters) and holds five payment checks
    worker = EventService.from_url(url, prefix=PREFIX, retry_attempts=0, heartbeat_interval=1)
    worker.add_handler(InvoiceSync, _fail, concurrency=2)
    worker.add_handler(PaymentCheck, _slow, concurrency=5)
    await worker.start()
    await producer.enqueue_many(
        [PaymentCheck(id=f"order-{39990 + i}", order_id=39990 + i) for i in range(8)]
    )
    for _ in range(100):
        if (await producer.stats_for("invoice-sync")).dead >= 9:
            break
        await asyncio.sleep(0.1)
    await worker.remove_handler(InvoiceSync)
    await producer.aclose()
    return worker


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/img")
    out.mkdir(parents=True, exist_ok=True)
    with RedisServer() as server:
        loop = asyncio.new_event_loop()
        worker = loop.run_until_complete(seed(server.url))
        import redis

        raw = redis.Redis.from_url(server.url, protocol=2)
        _history(raw, "payment-check", 40, 0.01)
        _history(raw, "email-reminder", 12, 0.002)
        _history(raw, "invoice-sync", 3, 0.3)
        # keep the worker's heartbeat and its handlers alive while the pictures are taken
        threading.Thread(target=loop.run_forever, daemon=True).start()

        app = create_app(server.url, PREFIX, refresh_seconds=0)
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning")
        web = uvicorn.Server(config)
        threading.Thread(target=web.run, daemon=True).start()
        while not web.started:
            time.sleep(0.05)
        port = web.servers[0].sockets[0].getsockname()[1]
        base = f"http://127.0.0.1:{port}"

        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        os.environ.setdefault("SE_OFFLINE", "true")
        options = webdriver.ChromeOptions()
        options.binary_location = "/usr/bin/chromium"
        for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     f"--user-data-dir={tempfile.mkdtemp()}", "--hide-scrollbars"):  # fmt: skip
            options.add_argument(flag)
        driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
        try:
            driver.set_window_size(1280, 1000)
            driver.get(base + "/")
            driver.save_screenshot(str(out / "dashboard-overview.png"))
            driver.set_window_size(1280, 1700)
            driver.get(base + "/type?name=payment-check")
            driver.save_screenshot(str(out / "dashboard-type.png"))
            driver.set_window_size(1280, 900)
            driver.get(base + "/type?name=invoice-sync#dead")
            driver.save_screenshot(str(out / "dashboard-dead.png"))
            driver.set_window_size(400, 860)
            driver.get(base + "/")
            driver.save_screenshot(str(out / "dashboard-phone.png"))
        finally:
            driver.quit()
            web.should_exit = True
        asyncio.run_coroutine_threadsafe(worker.aclose(), loop).result(timeout=30)
        print(f"screenshots in {out}")


if __name__ == "__main__":
    main()
