"""Turns a run's results into the compact JSON and the Markdown tables (stdlib only)."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["compact", "markdown", "one_line", "targets"]

CDF_STEPS = 1000  # quantile points kept per sample set in the compact JSON


def _quantiles(values: list[float]) -> list[float]:
    s = sorted(values)
    if not s:
        return []
    out = []
    for k in range(CDF_STEPS + 1):
        pos = (len(s) - 1) * k / CDF_STEPS
        lo = math.floor(pos)
        hi = min(lo + 1, len(s) - 1)
        out.append(round(s[lo] + (s[hi] - s[lo]) * (pos - lo), 3))
    return out


def compact(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary with every sample list replaced by its quantiles (0..100 %, 1001 points)."""
    out = dict(summary)
    results = []
    for r in summary["results"]:
        r = dict(r)
        samples = r.pop("samples", {}) or {}
        r["cdf"] = {name: _quantiles(values) for name, values in samples.items() if values}
        results.append(r)
    out["results"] = results
    return out


def one_line(r: dict[str, Any]) -> str:
    """A short progress line for one result."""
    if not r.get("ok"):
        return f"{r.get('label')} {r.get('case')}: FAILED {str(r.get('error'))[:300]}"
    m = r.get("metrics", {})
    keys = ("p50_ms", "p99_ms", "redis_p50_ms", "redis_p99_ms", "missing", "rate",
            "cpu_per_event_us", "recovery_s", "overhead_bytes_per_event", "commands_per_s",
            "cpu_percent", "single_rate", "many_rate", "moves_per_s", "script_max_ms",
            "achieved_rate")  # fmt: skip
    shown = ", ".join(f"{k}={m[k]}" for k in keys if k in m)
    return f"{r.get('label')} {r.get('case')}: {shown} ({r.get('duration_s')} s)"


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        if math.isnan(value):
            return "–"
        if abs(value) >= 10_000:
            return f"{value:,.0f}"
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _ms(value: Any) -> str:
    if value is None:
        return "–"
    if abs(value) >= 1000:
        return f"{value / 1000:,.2f} s"
    return f"{value:,.1f} ms"


def _by_case(results: list[dict[str, Any]], case: str) -> list[dict[str, Any]]:
    return [r for r in results if r.get("case") == case]


def _failed(r: dict[str, Any]) -> str:
    return "failed: " + str(r.get("error", "")).strip().splitlines()[0][:120]


def _lateness_table(rows: list[dict[str, Any]], sustained: bool = False) -> list[str]:
    head = (
        "| library | "
        + ("achieved rate | " if sustained else "")
        + ("p50 | p90 | p99 | max | early | missing | duplicates |")
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        m = r.get("metrics", {})
        if not r.get("ok"):
            lines.append(f"| {r['label']} | {_failed(r)} |")
            continue
        prefix = f"| {r['label']} | " + (
            f"{_fmt(m.get('achieved_rate'), 0)}/s | " if sustained else ""
        )
        lines.append(
            prefix
            + " | ".join(_ms(m.get(k)) for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms"))
            + f" | {m.get('early', '–')} | {m.get('missing', '–')} | {m.get('duplicates', '–')} |"
        )
        if "redis_p50_ms" in m:
            lines.append(
                prefix.replace(r["label"], f"{r['label']}, Redis clock¹")
                + " | ".join(
                    _ms(m.get("redis_" + k)) for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms")
                )
                + f" | {m.get('redis_early', '–')} | | |"
            )
    return lines


def _labels(results: list[dict[str, Any]]) -> list[str]:
    seen: list[str] = []
    for r in results:
        if r.get("variant") == "default" and r["label"] not in seen:
            seen.append(r["label"])
    return seen


def _get(results: list[dict[str, Any]], label: str, case: str) -> dict[str, Any] | None:
    for r in results:
        if r["label"] == label and r.get("case") == case:
            return r
    return None


def best_peer_rate(results: list[dict[str, Any]], case: str) -> tuple[str | None, float]:
    """The fastest non-delayq library in a throughput case."""
    best: tuple[str | None, float] = (None, 0.0)
    for r in _by_case(results, case):
        if r["library"] != "delayq" and r.get("ok"):
            rate = r["metrics"].get("rate") or 0.0
            if rate > best[1]:
                best = (r["label"], rate)
    return best


def targets(results: list[dict[str, Any]]) -> list[tuple[str, str, str, str]]:
    """(workload, target, delayq measured, verdict) rows for the issue's targets."""
    rows: list[tuple[str, str, str, str]] = []

    def m(case: str) -> dict[str, Any] | None:
        r = _get(results, "delayq", case)
        return r["metrics"] if r and r.get("ok") else None

    def verdict(ok: bool) -> str:
        return "met" if ok else "**missed**"

    lat = m("lateness")
    if lat:
        ok = lat["redis_p50_ms"] <= 3 and lat["redis_p99_ms"] <= 20 and lat["redis_early"] == 0
        rows.append((
            "1 lateness", "p50 ≤ 3 ms, p99 ≤ 20 ms, never early",
            f"p50 {lat['redis_p50_ms']:.1f} ms, p99 {lat['redis_p99_ms']:.1f} ms, "
            f"{lat['redis_early']} early, {lat['missing']} missing", verdict(ok),
        ))  # fmt: skip
    sus = m("sustained")
    if sus:
        rows.append((
            f"1 lateness at {_fmt(sus['offered_rate'], 0)}/s", "p99 ≤ 50 ms (at 2,000/s)",
            f"p99 {sus['redis_p99_ms']:.1f} ms at {sus['achieved_rate']:.0f}/s",
            verdict(sus["redis_p99_ms"] <= 50),
        ))  # fmt: skip
    for case, procs in (("throughput-1p", 1), ("throughput-2p", 2)):
        t = m(case)
        if t:
            peer, rate = best_peer_rate(results, case)
            target = "≥ 15,000/s and ≥ 5× best peer" if procs == 1 else "≥ 5× best peer"
            if rate:
                ratio = t["rate"] / rate
                shown = f"{t['rate']:,.0f}/s = {ratio:.1f}× {peer} ({rate:,.0f}/s)"
            else:
                ratio = math.inf
                shown = f"{t['rate']:,.0f}/s (no peer measured)"
            ok = ratio >= 5 and (procs != 1 or t["rate"] >= 15_000)
            rows.append((
                f"2 throughput, {procs} process{'es' if procs > 1 else ''}", target, shown,
                verdict(ok),
            ))  # fmt: skip
    enq = m("enqueue")
    if enq:
        rows.append((
            "3 enqueue", "≥ 15,000/s single, ≥ 100,000/s enqueue_many",
            f"{enq['single_rate']:,.0f}/s single, {enq['many_rate']:,.0f}/s many",
            verdict(enq["single_rate"] >= 15_000 and enq["many_rate"] >= 100_000),
        ))  # fmt: skip
    drain = m("drain")
    if drain:
        mx = drain["script_max_ms"]
        mx_num = 0.0 if isinstance(mx, str) else mx
        rows.append((
            "4 scheduler drain", "≥ 150,000 moves/s, no script > 10 ms",
            f"{drain['moves_per_s']:,.0f}/s, longest script {mx} ms",
            verdict(drain["moves_per_s"] >= 150_000 and mx_num <= 10),
        ))  # fmt: skip
    crash = m("crash")
    if crash:
        rec = crash.get("recovery_s")
        rows.append((
            "5 crash recovery", "≤ visibility_timeout (15 s default, ≤ 30 s)",
            f"{rec} s" if rec is not None else "not within cap", verdict(rec is not None and rec <= 15),
        ))  # fmt: skip
    mem = m("memory")
    if mem:
        rows.append((
            "6 memory", "≤ 200 B per event beyond the payload",
            f"{mem['bytes_per_event']:.0f} B/event = {mem['overhead_bytes_per_event']:.0f} B beyond "
            f"the {mem['payload_bytes']} B payload (n = {mem['n']:,})",
            verdict(mem["overhead_bytes_per_event"] <= 200),
        ))  # fmt: skip
    idle = m("idle")
    if idle:
        rows.append((
            "7 idle cost", "≤ 1 command/s per type, < 1 % CPU",
            f"{idle['commands_per_s_per_type']:.2f} commands/s per type ({idle['types']} types), "
            f"{idle['cpu_percent']:.2f} % CPU",
            verdict(idle["commands_per_s_per_type"] <= 1 and idle["cpu_percent"] < 1),
        ))  # fmt: skip
    t1 = m("throughput-1p")
    if t1:
        rows.append(
            (
                "8 client CPU per event",
                "reported for every library",
                f"{t1['cpu_per_event_us']:.0f} µs/event (1 process)",
                "see table",
            )
        )
    return rows


def markdown(s: dict[str, Any], plots: list[str] | None = None) -> str:
    """The tables of one run."""
    res = s["results"]
    mach = s["machine"]
    load = s["load_average"]
    out = [
        f"Command: `{s['command']}` (profile `{s['profile']}`)",
        "",
        f"Run {s['started']} → {s['finished']} on {mach['nproc']} × {mach['cpu_model']} "
        f"({mach['memory']}, Linux {mach['kernel']}, Python {mach['python']}); "
        f"Redis {s['redis']['version']} ({s['redis']['allocator']}), "
        f"delayq at {s['git']['commit'][:10]}"
        + (" + uncommitted changes" if s["git"].get("dirty_delayq") else "")
        + ".",
        "",
        f"Load average (1 min) before {load['before'][0]:.2f}, after {load['after'][0]:.2f}, "
        f"between cases {load['min_1min']:.2f}–{load['max_1min']:.2f}.",
        "",
        "## delayq against its targets",
        "",
        "| workload | target | delayq | |",
        "|---|---|---|---|",
    ]
    out += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in targets(res)]
    for case, title in (("lateness", "Lateness"), ("sustained", "Lateness at a sustained rate")):
        rows = _by_case(res, case)
        if rows:
            p = rows[0]["params"]
            desc = (
                f"{p.get('n', 5000):,} events, delays uniform over {p.get('spread', 10)} s"
                if case == "lateness"
                else f"{p.get('rate', 2000):,.0f} events/s offered for {p.get('duration', 10)} s, "
                f"each due {p.get('delay', 1)} s later"
            )
            out += ["", f"## {title} ({desc})", ""]
            out += _lateness_table(rows, sustained=case == "sustained")
    if any(r.get("redis_p50_ms") for r in [x.get("metrics", {}) for x in res]):
        out += [
            "",
            "¹ delayq's own `Delivery.lateness_ms`: claim time minus due time, both on Redis's "
            "clock. Every other row: handler start (`time.time()` in the handler) minus "
            "(`time.time()` before the enqueue call + delay), all processes on this machine.",
        ]
    tp = [lab for lab in _labels(res) if _get(res, lab, "throughput-1p")]
    if tp:
        p = _get(res, tp[0], "throughput-1p")["params"]  # type: ignore[index]
        out += [
            "",
            f"## End-to-end throughput ({p.get('n', 0):,} events due now, no-op handler, "
            f"cap {p.get('cap')} s)",
            "",
            "| library | 1 process | 2 processes | client CPU/event (1 p.) | (2 p.) | producer enqueue |",
            "|---|---|---|---|---|---|",
        ]
        for lab in tp:
            one, two = _get(res, lab, "throughput-1p"), _get(res, lab, "throughput-2p")

            def cell(r: dict[str, Any] | None, key: str, unit: str) -> str:
                if r is None:
                    return "–"
                if not r.get("ok"):
                    return "failed"
                v = r["metrics"].get(key)
                capped = any("cap" in n for n in r.get("notes", []))
                return f"{_fmt(v, 0)}{unit}" + (" (capped)" if capped and key == "rate" else "")

            out.append(
                f"| {lab} | {cell(one, 'rate', '/s')} | {cell(two, 'rate', '/s')} | "
                f"{cell(one, 'cpu_per_event_us', ' µs')} | {cell(two, 'cpu_per_event_us', ' µs')} "
                f"| {cell(one, 'enqueue_rate', '/s')} |"
            )
        spread = _get(res, "delayq", "throughput-spread")
        if spread and spread.get("ok"):
            sm = spread["metrics"]
            sp = spread["params"]
            out += [
                "",
                f"delayq, {sp['n']:,} events due over {sp['spread']} s (enqueued while the worker "
                f"runs): {sm['rate']:,.0f}/s from first due time to last handled, lateness p50 "
                f"{_ms(sm.get('redis_p50_ms'))}, p99 {_ms(sm.get('redis_p99_ms'))} (Redis clock), "
                f"{sm['cpu_per_event_us']:.0f} µs client CPU per event.",
            ]
    rows = _by_case(res, "crash")
    if rows:
        out += [
            "",
            "## Crash recovery (worker SIGKILLed 1 s into a handler; time until another worker "
            "starts the event; defaults)",
            "",
            "| library | recovery | |",
            "|---|---|---|",
        ]
        for r in rows:
            m = r.get("metrics", {})
            if not r.get("ok"):
                out.append(f"| {r['label']} | {_failed(r)} | |")
            elif m.get("recovery_s") is None:
                out.append(f"| {r['label']} | > {m.get('cap_s'):.0f} s (not within the cap) | |")
            else:
                out.append(f"| {r['label']} | {m['recovery_s']:.1f} s | |")
    rows = _by_case(res, "memory")
    if rows:
        out += [
            "",
            "## Redis memory per scheduled event (100-byte payload, `INFO memory` used_memory)",
            "",
            "| library | events | bytes/event | beyond the payload |",
            "|---|---|---|---|",
        ]
        for r in rows:
            m = r.get("metrics", {})
            if not r.get("ok"):
                out.append(f"| {r['label']} | {_failed(r)} | | |")
                continue
            out.append(
                f"| {r['label']} | {m['n']:,} | {m['bytes_per_event']:,.0f} | "
                f"{m['overhead_bytes_per_event']:,.0f} |"
            )
    rows = _by_case(res, "idle")
    if rows:
        out += [
            "",
            "## Idle cost (one idle worker; commands counted with MONITOR, calls inside scripts "
            "excluded)",
            "",
            "Baseline: a bare asyncio process that wakes 5 times a second measures "
            f"{mach.get('asyncio_loop_waking_5_per_s_cpu_percent')} % CPU on this machine "
            "(what a wake-up costs here dominates every idle-CPU figure).",
            "",
            "| library | types | commands/s | per type | client CPU | commands seen |",
            "|---|---|---|---|---|---|",
        ]
        for r in rows:
            m = r.get("metrics", {})
            if not r.get("ok"):
                out.append(f"| {r['label']} | {_failed(r)} | | | | |")
                continue
            seen = ", ".join(f"{k} {v}" for k, v in m.get("by_command", {}).items())
            out.append(
                f"| {r['label']} | {m['types']} | {m['commands_per_s']:.2f} | "
                f"{m['commands_per_s_per_type']:.3f} | {m['cpu_percent']:.2f} % | {seen} |"
            )
    enq = _get(res, "delayq", "enqueue")
    drain = _get(res, "delayq", "drain")
    if (enq and enq.get("ok")) or (drain and drain.get("ok")):
        out += ["", "## delayq only: enqueue and scheduler drain", ""]
        if enq and enq.get("ok"):
            m = enq["metrics"]
            out.append(
                f"- enqueue_with_delay, awaited, from {m['single_tasks']} tasks: "
                f"{m['single_rate']:,.0f}/s ({m['single_cpu_per_call_us']:.0f} µs CPU per call); "
                f"enqueue_many in batches of {m['many_batch']:,}: {m['many_rate']:,.0f}/s "
                f"({m['many_cpu_per_event_us']:.1f} µs CPU per event)."
            )
        if drain and drain.get("ok"):
            m = drain["metrics"]
            out.append(
                f"- drain: {m['due']:,} of {m['total']:,} scheduled events due at once reached "
                f"the ready list in {m['drain_s']:.3f} s = {m['moves_per_s']:,.0f} moves/s; "
                f"{m['script_calls']} script calls, mean {m['script_mean_ms']} ms, longest "
                f"{m['script_max_ms']} ms ({m['scripts_over_10ms']} over 10 ms; SLOWLOG at 1 ms)."
            )
    out += ["", "## Versions", "", "| library | versions |", "|---|---|"]
    for lib, versions in s.get("versions", {}).items():
        out.append(f"| {lib} | " + ", ".join(f"{k} {v}" for k, v in versions.items()) + " |")
    notes = {}
    for r in res:
        for n in r.get("notes", []):
            notes.setdefault(r["label"], [])
            if n not in notes[r["label"]]:
                notes[r["label"]].append(n)
    if notes:
        out += ["", "## How each library ran", ""]
        out += [f"- **{lab}**: " + "; ".join(ns) for lab, ns in notes.items()]
    failed = [r for r in res if not r.get("ok")]
    if failed:
        out += ["", "## Failures", ""]
        out += [f"- {r['label']} {r.get('case')}: {_failed(r)}" for r in failed]
    if plots:
        out += ["", "## Plots", ""]
        out += [f"![{p}]({p})" for p in plots]
    return "\n".join(out) + "\n"
