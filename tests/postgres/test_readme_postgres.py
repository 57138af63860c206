"""The PostgreSQL guide's example (once the README's) runs as written, after the README's
first example (against the test Redis and PostgreSQL)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import redis.asyncio as aioredis

README = Path(__file__).resolve().parents[2] / "README.md"
GUIDE = README.parent / "docs" / "guides" / "postgres.md"


async def test_readme_outbox_example(redis_url, postgres_url, prefix, wait_for, pg) -> None:
    first = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)[0]
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(encoding="utf-8"), flags=re.S)
    (example,) = [b for b in blocks if "OutboxRelay(service, DSN)" in b]
    source = (first + "\n" + example).replace("redis://localhost:6379/0", redis_url)
    source = source.replace('"shop"', repr(prefix)).replace(
        '"postgresql://localhost/shop"', repr(postgres_url)
    )
    code = compile(source, str(GUIDE), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    namespace: dict[str, object] = {"__name__": "readme_example"}
    try:
        result = eval(code, namespace)  # our own README, never a payload
        if result is not None:
            await result
        client = aioredis.Redis.from_url(redis_url, protocol=2)
        try:
            name = namespace["PaymentCheck"].event_name  # type: ignore[attr-defined]
            due = await client.zscore(f"{{{prefix}:{name}}}:scheduled", "order-43")
            if due is None:  # the relay closed before the commit's notification reached it
                assert await pg.fetchval('SELECT count(*) FROM "delayq".outbox') == 1
        finally:
            await client.aclose()
    finally:
        await pg.execute('DROP SCHEMA IF EXISTS "delayq" CASCADE')
