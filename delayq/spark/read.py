"""read_queue: scheduled, ready, in-flight and dead events as a DataFrame, read in parallel pages."""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import msgspec
from pyspark.sql import DataFrame, SparkSession

from ..codec import Codec, open_envelope
from ..errors import DecodeError
from ..events import Event, check_event_type, validate_name
from ..keys import DEFAULT_GROUP, PrefixKeys, TypeKeys
from ..partitions.shards import parse_member
from .clients import new_client, resolve_cluster, shared_client
from .schemas import QUEUE_SCHEMA, STATES

log = logging.getLogger("delayq.spark")

_READ_PAGE = 5000

# --------------------------------------------------------------------------- read_queue


def _decode_any(data: bytes, event_id: bytes) -> tuple[str, dict[str, str], int]:
    """``(payload_json, context, enqueued_at_ms)`` of an envelope, without its event class."""
    opened = open_envelope(data, event_id)
    try:
        if opened.serializer == "json":
            payload = opened.payload.decode("utf-8")
        else:
            payload = msgspec.json.encode(msgspec.msgpack.decode(opened.payload)).decode("utf-8")
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, TypeError) as exc:
        raise DecodeError(f"cannot decode envelope: {exc}") from exc
    return payload, opened.context, opened.enqueued_at_ms


def _utc(ms: float | None) -> datetime | None:
    if ms is None or ms <= 0:
        return None
    return datetime.fromtimestamp(ms / 1000, timezone.utc)


@dataclass(frozen=True)
class _Page:
    """One slice of one state set of one type: a task of :func:`read_queue`."""

    type_name: str
    state: str
    start: int
    stop: int
    partition: int = 0
    partitions: int = 1
    group: str | None = None


@dataclass(frozen=True)
class _ReadJob:
    redis_url: str
    cluster: bool
    prefix: str
    classes: Mapping[str, type[Event] | None]


# the states a delivery group has sets of its own (the schedule is the type's)
_GROUP_STATES = ("ready", "in_flight", "dead")


def _state_key(keys: TypeKeys, state: str, group: str | None = None) -> str:
    if group is not None and group != DEFAULT_GROUP:
        return keys.group_key(group, {"ready": "queued", "in_flight": "inflight"}.get(state, state))
    return {
        "scheduled": keys.scheduled,
        "ready": keys.queued,
        "in_flight": keys.inflight,
        "dead": keys.dead,
    }[state]


def _hashes(keys: TypeKeys, group: str | None) -> tuple[str, str]:
    """The attempts and errors hashes of a group (the type's own for the default group)."""
    if group is None or group == DEFAULT_GROUP:
        return keys.attempts, keys.errors
    return keys.group_key(group, "attempts"), keys.group_key(group, "errors")


def _read_page(job: _ReadJob, page: _Page) -> Iterator[tuple[Any, ...]]:
    """Read one page: ZRANGE by index, then HMGET of envelopes, attempts and errors."""
    client = shared_client(job.redis_url, job.cluster)
    keys = TypeKeys(job.prefix, page.type_name, page.partition, page.partitions)
    state_key = _state_key(keys, page.state, page.group)
    attempts_key, errors_key = _hashes(keys, page.group)
    members = client.zrange(state_key, page.start, page.stop, withscores=True)
    if not members:
        return
    ids = [m for m, _ in members]
    pipe = client.pipeline(transaction=False)
    pipe.hmget(keys.events, ids)
    pipe.hmget(attempts_key, ids)
    pipe.hmget(errors_key, ids)
    envelopes, attempts, errors = pipe.execute()
    # An id without an envelope was acked or purged between the two reads, unless
    # it is still in its state: only then is its envelope really missing.
    gone: set[bytes] = set()
    lost = [raw_id for raw_id, env in zip(ids, envelopes) if env is None]
    if lost:
        pipe = client.pipeline(transaction=False)
        for raw_id in lost:
            pipe.zscore(state_key, raw_id)
        gone = {raw_id for raw_id, s in zip(lost, pipe.execute()) if s is None}
    cls = job.classes.get(page.type_name)
    codec = Codec()
    for (raw_id, score), env, att, err in zip(members, envelopes, attempts, errors):
        if raw_id in gone:
            continue
        last_error = err.decode("utf-8", "replace") if err else None
        payload_json = context_json = None
        enqueued = None
        problem = None
        if env is None:
            problem = "the stored event is missing"
        else:
            try:
                if cls is not None:
                    event, context = codec.decode(env, cls, raw_id)
                    payload_json = msgspec.json.encode(event).decode("utf-8")
                    enqueued = _utc(open_envelope(env, raw_id).enqueued_at_ms)
                else:
                    payload_json, context, enqueued_ms = _decode_any(env, raw_id)
                    enqueued = _utc(enqueued_ms)
                context_json = msgspec.json.encode(context).decode("utf-8")
            except DecodeError as exc:
                problem = str(exc)
        if problem is not None:
            last_error = problem if last_error is None else f"{problem}; last error: {last_error}"
        due = None if page.state == "ready" else _utc(score)
        yield (
            page.type_name,
            raw_id.decode("utf-8", "replace"),
            page.state,
            due,
            int(att) if att else 0,
            last_error,
            payload_json,
            context_json,
            enqueued,
            page.group,
        )


def read_queue(
    spark: SparkSession,
    *,
    redis_url: str,
    prefix: str,
    event_types: Iterable[type[Event] | str] | None = None,
    states: Iterable[str] = ("scheduled", "ready", "dead"),
    page_size: int = _READ_PAGE,
    cluster: bool | None = None,
) -> DataFrame:
    """Read queued events into a DataFrame (schema :data:`QUEUE_SCHEMA`).

    One row per event and state, with columns ``event_type``, ``id``,
    ``state`` (``scheduled``, ``ready``, ``in_flight`` or ``dead``),
    ``due_at`` (due time when scheduled, lease deadline when in flight, time
    of failure when dead, null when ready), ``attempts`` (deliveries so far),
    ``last_error``, ``payload_json``, ``context_json``, ``enqueued_at`` and
    ``group``. A type with named delivery groups also has rows from each
    group's ready, in-flight and dead sets, with the group's name in ``group``
    (``"default"`` for handlers added without a group); ``group`` is null on
    scheduled rows (the schedule is the type's) and on every row of a type
    without named groups.

    ``event_types`` are Event classes (payloads are validated against them and
    an undecodable one gets a null payload and the reason in ``last_error``)
    or wire names (payloads are converted to JSON as stored); by default every
    type registered under ``prefix``. The driver counts each state set once
    (ZCARD) and cuts it into ``page_size`` index ranges; each range is one
    Spark partition that reads its ids with ZRANGE and their envelopes,
    attempts and errors with pipelined HMGETs, so no call grows with the queue.

    The result is lazy: Redis is read when an action runs, with the page
    boundaries counted here. On a live queue an event that moves while it is
    read may be missed or seen twice; ``.cache()`` the result to analyse one
    consistent read several times.
    """
    if not isinstance(page_size, int) or isinstance(page_size, bool) or page_size < 1:
        raise ValueError(f"page_size must be a positive int, not {page_size!r}")
    wanted = tuple(dict.fromkeys(states))
    for state in wanted:
        if state not in STATES:
            raise ValueError(f"unknown state {state!r}; choose from {STATES}")
    prefix_keys = PrefixKeys(prefix)
    is_cluster = resolve_cluster(redis_url, cluster)
    client = new_client(redis_url, is_cluster)
    try:
        classes: dict[str, type[Event] | None] = {}
        # partition counts each type has events in ("T" and "T#N" members)
        layouts: dict[str, set[int]] = {}
        for member in client.smembers(prefix_keys.types):
            text = member.decode("utf-8", "replace")
            try:
                name, count = parse_member(text)
                layouts.setdefault(validate_name(name), set()).add(count)
            except (TypeError, ValueError):
                log.warning("ignoring invalid event type name %r in %s", text, prefix_keys.types)
        if event_types is None:
            classes = dict.fromkeys(layouts)
        else:
            if isinstance(event_types, (str, type)):
                event_types = [event_types]
            for item in event_types:
                if isinstance(item, str):
                    classes.setdefault(validate_name(item), None)
                else:
                    cls = check_event_type(item)
                    classes[cls.event_name] = cls
                    layouts.setdefault(cls.event_name, set()).add(cls.event_partitions)
        names = sorted(classes)
        # a partitioned type is read shard by shard and shows as one type
        shards = [
            (name, k, count)
            for name in names
            for count in sorted(layouts.get(name) or {1})
            for k in range(count)
        ]
        # each shard's delivery groups (registered in every partition alike)
        pipe = client.pipeline(transaction=False)
        for name, k, count in shards:
            pipe.hkeys(TypeKeys(prefix, name, k, count).groups)
        found = pipe.execute() if shards else []
        # (shard, state, group): the sets to read; the default group's are the type's
        sets: list[tuple[tuple[str, int, int], str, str | None]] = []
        for shard, groups in zip(shards, found):
            named = sorted(g.decode() if isinstance(g, bytes) else str(g) for g in groups)
            for state in wanted:
                grouped = bool(named) and state in _GROUP_STATES
                sets.append((shard, state, DEFAULT_GROUP if grouped else None))
                if grouped:
                    sets.extend((shard, state, g) for g in named if g != DEFAULT_GROUP)
        pipe = client.pipeline(transaction=False)
        for (name, k, count), state, group in sets:
            pipe.zcard(_state_key(TypeKeys(prefix, name, k, count), state, group))
        sizes = iter(pipe.execute()) if sets else iter(())
        pages = [
            _Page(name, state, start, min(start + page_size, size) - 1, k, count, group)
            for (name, k, count), state, group in sets
            for size in [int(next(sizes))]
            for start in range(0, size, page_size)
        ]
    finally:
        client.close()
    log.info("read_queue %s: %d types, %d pages", prefix, len(names), len(pages))
    if not pages:
        return spark.createDataFrame([], QUEUE_SCHEMA)
    job = _ReadJob(redis_url, is_cluster, prefix, classes)
    rdd = spark.sparkContext.parallelize(pages, len(pages)).flatMap(
        functools.partial(_read_page, job)
    )
    return spark.createDataFrame(rdd, QUEUE_SCHEMA)
