"""``delayq check``: can this service run against this Redis?"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import typer
from rich.table import Table

from .. import lua
from ..service import EventService
from .ops import run
from .output import console, print_json, text
from .target import load_service
from .worker import Factory, Target

__all__ = ["check", "register", "run_checks"]

# A sample of every command delayq sends or its scripts call (ACLs apply inside
# scripts too), for ACL DRYRUN: {cmd} -> its arguments, with K a key of the prefix.
_SAMPLES: dict[str, list[str]] = {
    "evalsha": ["0" * 40, "1", "K"],
    "script": ["load", "return 1"],
    "brpop": ["K", "1"],
    "subscribe": ["C"],
    "unsubscribe": ["C"],
    "sadd": ["K", "m"],
    "smembers": ["K"],
    "zcard": ["K"],
    "zrange": ["K", "0", "1"],
    "time": [],
    "type": ["K"],
    "get": ["K"],
    "set": ["K", "v"],
    "del": ["K"],
    "pexpire": ["K", "1"],
    "pttl": ["K"],
    "hget": ["K", "f"],
    "hmget": ["K", "f"],
    "hset": ["K", "f", "v"],
    "hdel": ["K", "f"],
    "hincrby": ["K", "f", "1"],
    "hexists": ["K", "f"],
    "llen": ["K"],
    "lindex": ["K", "0"],
    "lpush": ["K", "v"],
    "rpop": ["K"],
    "zadd": ["K", "1", "m"],
    "zrem": ["K", "m"],
    "zscore": ["K", "m"],
    "zcount": ["K", "0", "1"],
    "zrangebyscore": ["K", "0", "1"],
    "zrevrangebyscore": ["K", "1", "0"],
    "zpopmin": ["K"],
    "publish": ["C", "m"],
    # partitioned types: scheduler membership and retiring a layout
    "zremrangebyscore": ["K", "0", "1"],
    "srem": ["K", "m"],
    # flow keys: each key's line of ready events
    "zrangebylex": ["K", "-", "+"],
    "zlexcount": ["K", "-", "+"],
}


async def run_checks(service: EventService) -> list[dict[str, Any]]:
    """Each check as ``{"name", "status": "ok"|"warn"|"fail", "detail"}``."""
    results: list[dict[str, Any]] = []

    def add(name: str, status: str, detail: str) -> None:
        results.append({"name": name, "status": status, "detail": detail})

    store = service.store
    redis: Any = store.redis
    try:
        await asyncio.wait_for(store.browsing.server_time_ms(), 10)
    except Exception as exc:
        add("redis", "fail", f"cannot reach Redis: {type(exc).__name__}: {exc}")
        return results
    add("redis", "ok", "reachable")
    names = (*lua.PER_TYPE, *lua.STANDALONE)
    try:
        for name in names:
            await redis.script_load(lua.source(name))
        add("lua", "ok", f"{len(names)} scripts loaded")
    except Exception as exc:
        add("lua", "fail", f"SCRIPT LOAD failed: {exc}")
    policy = await store.browsing.eviction_policy()
    if policy == "noeviction":
        add("maxmemory-policy", "ok", "noeviction")
    elif policy is None:
        add(
            "maxmemory-policy",
            "warn",
            "cannot read it (CONFIG GET not allowed); make sure it is noeviction",
        )
    else:
        add(
            "maxmemory-policy",
            "warn",
            f"{policy}: Redis may evict queue keys and lose events; set noeviction",
        )
    add(*await _check_acl(redis, service.options.prefix))
    handled = service.handled_types
    add("handlers", "ok" if handled else "warn", ", ".join(handled) or "no handlers registered")
    return results


async def _check_acl(redis: Any, prefix: str) -> tuple[str, str, str]:
    key, channel = f"{{{prefix}:delayq-check}}:k", f"{{{prefix}}}:wakeup"
    try:
        user = await redis.execute_command("ACL", "WHOAMI")
        user = user.decode() if isinstance(user, bytes) else str(user)
        denied = []
        for command, sample in _SAMPLES.items():
            args = [key if a == "K" else channel if a == "C" else a for a in sample]
            reply = await redis.execute_command("ACL", "DRYRUN", user, command, *args)
            reply = reply.decode() if isinstance(reply, bytes) else str(reply)
            if reply not in ("OK", "True"):
                denied.append(command)
    except Exception as exc:  # Redis < 7 has no DRYRUN; a restricted user may not run ACL
        return "acl", "warn", f"not verified ({exc}); see the ACL line in docs/RELIABILITY.md"
    if denied:
        return "acl", "fail", f"user {user!r} may not run: {' '.join(denied)}"
    return "acl", "ok", f"user {user!r} may run all {len(_SAMPLES)} commands delayq needs"


def check(
    target: Target,
    factory: Factory = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
) -> None:
    """Check that the service can run: Redis reachable, Lua scripts load,
    maxmemory-policy is noeviction (a warning otherwise), the ACL allows every command
    delayq needs. Exit code 0 when nothing failed (warnings allowed), 1 otherwise."""

    async def main() -> list[dict[str, Any]]:
        service = await load_service(target, factory)
        try:
            return await run_checks(service)
        finally:
            await service.aclose()

    results = run(main)
    ok = all(r["status"] != "fail" for r in results)
    if as_json:
        print_json({"ok": ok, "checks": results})
    else:
        table = Table(show_header=False, box=None)
        style = {"ok": "green", "warn": "yellow", "fail": "bold red"}
        for r in results:
            table.add_row(r["name"], f"[{style[r['status']]}]{r['status']}[/]", text(r["detail"]))
        console.print(table)
    raise typer.Exit(0 if ok else 1)


def register(app: typer.Typer) -> None:
    """Add ``check`` to the app."""
    app.command(rich_help_panel="Run")(check)
