
import asyncio, sys
from delayq import Event, EventService, current_delivery

class Urgent(Event, event_name="prio-bench"):
    sent: float = 0.0

url, prefix, out = sys.argv[1], sys.argv[2], sys.argv[3]

async def main() -> None:
    lines = open(out, "a", buffering=1)

    async def handle(event: Urgent) -> None:
        if event.id.startswith("probe-"):
            d = current_delivery()
            lines.write(f"{event.id} {d.claimed_us / 1000 - d.due_ms:.3f}\n")

    service = EventService.from_url(url, prefix=prefix)
    service.add_handler(Urgent, handle, concurrency=32)
    async with service:
        await asyncio.Event().wait()

asyncio.run(main())
