"""Enqueueing children: ``enqueue_*(..., after=[(ParentType, id), ...])``
(docs/WORKFLOWS.md, "Dependencies").

A child and its parents may live on different slots, so registering the edges takes
steps, each one script on one slot, in an order where a caller killed between any two
leaves something the relay's audit finishes (:mod:`delayq.runtime.relay`):

1. ``waiting``: the children are written, waiting, with every edge open and an audit
   due soon (``dep_wait.lua``, the child's slot). Killed before: nothing was written.
2. ``linked``: each parent's slot learns of its children, or answers that the parent is
   done already (``dep_link.lua``; idempotent). Killed between 1 and 2: the audit links.
3. ``applied``: the answers of parents done already are applied to the children
   (``dep_apply.lua``; idempotent). Killed between 2 and 3: the audit links again, and
   the parent, done, answers again.

A parent done after step 2 hands its completion to the child through the relay.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal, TypeVar

from ..codec import add_to_context, open_envelope
from ..context import PARENT_SPANS_KEY
from ..errors import DecodeError
from ..events import Event, EventTypes
from ..partitions.routing import Router
from ..partitions.shards import BATCH_TYPE, batch_shard, parse_shard, shard_for
from ..storage.store import Store

__all__ = [
    "AUDIT_MS",
    "CHUNK",
    "POLICIES",
    "STEP_HOOK",
    "Dependencies",
    "NotedShards",
    "ParentFailurePolicy",
    "ParentRef",
    "chunked",
    "merge_answers",
    "parent_refs",
    "parent_shards",
]

ParentFailurePolicy = Literal["fail", "run", "skip"]
"""What a child does when a parent failed (a dead letter), was cancelled or skipped:
``"fail"`` becomes a dead letter (``ParentFailed: ...``), ``"run"`` runs anyway (the failure
in ``current_delivery().parents``), ``"skip"`` is removed (counted as ``skipped``)."""

POLICIES: tuple[str, ...] = ("fail", "run", "skip")

ParentRef = tuple[type[Event] | str, str]
"""A parent in ``after=[...]``: ``(its class or wire name, its id)``."""

AUDIT_MS = 5000
"""When a waiting child's parents are first looked at again by the relay, ms after its
enqueue (then as long again as it has waited, up to an hour): what finishes a
registration whose caller died between two steps, and what releases a child whose parent
vanished without a completion."""

CHUNK = 1024
"""The most links (children, members, answers) one script call of the dependencies' and
the batches' steps takes, so that no call holds Redis for long whatever the caller
passed (an ``enqueue_many`` of 100,000 children, a batch's add of 100,000 members, the
relay's audits): a longer list goes in :func:`chunked` calls."""

STEP_HOOK: Callable[[str], None] | None = None
"""Tests only: called with each step's name (``"waiting"``, ``"linked"``, ``"applied"``)
after it, so a test can kill the process there."""

_T = TypeVar("_T")


def chunked(items: Sequence[_T], size: int = CHUNK) -> Iterator[Sequence[_T]]:
    """``items`` in slices of at most ``size`` (:data:`CHUNK`): one script call each."""
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _step(name: str) -> None:
    if STEP_HOOK is not None:
        STEP_HOOK(name)


def parent_refs(after: Iterable[Any], types: EventTypes) -> list[tuple[str, str]]:
    """``after=[...]`` checked: ``(wire name, id)`` pairs in order, each once."""
    if isinstance(after, (str, bytes)) or not isinstance(after, Iterable):
        raise TypeError(f"after= takes a list of (ParentType, id) pairs, not {after!r}")
    out: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for ref in after:
        if not (isinstance(ref, tuple) and len(ref) == 2):
            raise TypeError(f"after= takes (ParentType, id) pairs, not {ref!r}")
        kind, parent_id = ref
        if not isinstance(kind, str) and not (isinstance(kind, type) and issubclass(kind, Event)):
            raise TypeError(f"a parent's type is an Event class or a wire name, not {kind!r}")
        name = kind if kind == BATCH_TYPE else types.name(kind)  # a batch may be a parent
        if not isinstance(parent_id, str) or not parent_id or "\0" in parent_id:
            raise ValueError(f"a parent's id is a non-empty str without NUL, not {parent_id!r}")
        if (name, parent_id) not in seen:
            seen.add((name, parent_id))
            out.append((name, parent_id))
    if not out:
        raise ValueError("after= needs at least one parent")
    return out


def check_policy(policy: str) -> str:
    """``on_parent_failure`` checked."""
    if policy not in POLICIES:
        raise ValueError(f"on_parent_failure must be one of {POLICIES}, not {policy!r}")
    return policy


def parent_shards(store: Store, name: str, parent_id: str, partitions: int) -> list[str]:
    """The shards a parent may be in: its type's current layout's first, then those of the
    other layouts its type has events in (a repartition under way; usually none). A batch
    (``BATCH_TYPE``) is in its batch shard."""
    if name == BATCH_TYPE:
        return [batch_shard(parent_id)]
    out = [shard_for(name, parent_id, partitions)]
    for n in store.types.layouts(name):
        shard = shard_for(name, parent_id, n)
        if shard not in out:
            out.append(shard)
    return out


def merge_answers(answers: Sequence[bytes]) -> bytes:
    """One parent's ``dep_link`` answers from each of its shards (one per layout) as one:
    pending where any layout holds it, else an outcome recorded somewhere, else "missing",
    else "vanished" (linked in a layout it has left: it moved, so it is not a failure
    while another layout says anything else)."""
    if len(answers) == 1:
        return answers[0]
    if b"p" in answers:
        return b"p"
    kinds = [a.partition(b":")[2][:1] for a in answers]
    for wanted in (lambda k: k not in (b"m", b"v"), lambda k: k == b"m"):
        for answer, kind in zip(answers, kinds, strict=True):
            if wanted(kind):
                return answer
    return answers[0]


class NotedShards:
    """Records shards as dependency shards (``{p}:dshards``, the set the relay reads: its
    shards to look at), each once per process: the first time a shard is named, one
    ``SADD`` of those not recorded yet; afterwards nothing."""

    def __init__(self, store: Store):
        self._store = store
        self._noted: set[str] = set()  # recorded by this process (its own calls)

    async def note(self, shards: Iterable[str]) -> None:
        """Record ``shards`` (those this process has not recorded yet)."""
        new = [s for s in dict.fromkeys(shards) if s not in self._noted]
        if new:
            await self._store.dependencies.note_dependency_shards(new)
            self._noted.update(new)

    def known(self, shards: Iterable[str]) -> None:
        """``shards`` are recorded already (read from the set): never ``SADD`` them."""
        self._noted.update(shards)


class Dependencies:
    """Enqueues children (see the module docstring)."""

    def __init__(self, store: Store, router: Router, types: EventTypes, *, traced: bool = False):
        self._store = store
        self._router = router
        self._types = types
        # a tracing is configured: children carry their parents' creation contexts
        self._traced = traced
        self._noted = NotedShards(store)
        self.audit_ms = AUDIT_MS

    def partitions(self, name: str) -> int:
        """The partition count of a type known by name (its class's, else Redis's)."""
        cls = self._types.cls_of(name)
        return cls.event_partitions if cls is not None else self._store.types.layouts(name)[0]

    def keep_ms(self, shard: str) -> int | None:
        """How long the type of ``shard`` keeps results (None: it keeps none, or it is not
        defined in this process)."""
        cls = self._types.cls_of(parse_shard(shard)[0])
        return None if cls is None else cls.event_results_ms

    async def enqueue(
        self,
        name: str,
        partitions: int,
        items: Sequence[tuple[str, bytes, int]],
        *,
        absolute: bool,
        parents: Sequence[tuple[str, str]],
        policy: str,
    ) -> list[int]:
        """Enqueue children of type ``name`` waiting for ``parents``; a code per item (1
        added, 0 kept: the id existed, and its dependencies stay as they were)."""
        store = self._store
        split = self._router.split(name, partitions, items)
        homes = {(t, p): parent_shards(store, t, p, self.partitions(t)) for t, p in parents}
        await self._noted.note({*split, *(x for h in homes.values() for x in h)})
        if self._traced:
            items = await self._with_parent_spans(items, parents, homes)
        codes = [0] * len(items)
        added: list[tuple[str, str]] = []  # (child shard, child id)
        # Each step goes in chunks of CHUNK links, one script call each (dep_wait writes a
        # child with all its edges: CHUNK // len(parents) children a call), and a chunk is
        # a complete step for its children (written whole; linked, applied: idempotent):
        # a caller killed between two chunks leaves some children a step ahead of the
        # others, and the audit finishes each written one as after a kill between steps.
        per = max(1, CHUNK // len(parents))
        for shard, indexes in split.items():
            await store.types.register_type(shard)
            for some in chunked(indexes, per):
                got = await store.dependencies.dep_wait(
                    shard,
                    [items[i] for i in some],
                    absolute=absolute,
                    policy=policy,
                    audit_ms=self.audit_ms,
                    parents=parents,
                )
                for i, code in zip(some, got, strict=True):
                    codes[i] = code
                    if code:
                        added.append((shard, items[i][0]))
        _step("waiting")
        if not added:
            return codes
        by_parent_shard: dict[str, list[tuple[str, str]]] = {}
        for ref, shards in homes.items():
            for pshard in shards:
                by_parent_shard.setdefault(pshard, []).append(ref)
        answers: dict[tuple[str, str, str, str], list[bytes]] = {}
        for pshard, refs in by_parent_shard.items():
            links = [(t, p, cshard, cid) for t, p in refs for cshard, cid in added]
            for part in chunked(links):
                replies = await store.dependencies.dep_link(pshard, [x[1:] for x in part])
                for link, reply in zip(part, replies, strict=True):
                    answers.setdefault(link, []).append(reply)
        done: dict[str, list[tuple[str, str, bytes]]] = {}
        for (ptype, pid, cshard, cid), said in answers.items():
            answer = merge_answers(said)
            if answer != b"p":
                done.setdefault(cshard, []).append((cid, f"{ptype}\0{pid}", answer))
        _step("linked")
        for cshard, edges in done.items():
            for chunk in chunked(edges):
                await store.dependencies.dep_apply(cshard, chunk, self.keep_ms(cshard))
        _step("applied")
        return codes

    async def _with_parent_spans(
        self,
        items: Sequence[tuple[str, bytes, int]],
        parents: Sequence[tuple[str, str]],
        homes: dict[tuple[str, str], list[str]],
    ) -> Sequence[tuple[str, bytes, int]]:
        """``items`` whose contexts carry their parents' W3C ``traceparent`` (read from the
        parents' envelopes, pending now: the child's process span links to them when it
        runs, long after they are gone; one read per parent shard, with tracing only)."""
        by_shard: dict[str, list[tuple[str, str]]] = {}
        for ref, shards in homes.items():
            for pshard in shards:
                by_shard.setdefault(pshard, []).append(ref)
        found: dict[tuple[str, str], str] = {}
        for pshard, refs in by_shard.items():
            got: list[bytes | None] = []
            for part in chunked(refs):
                got += await self._store.dependencies.envelopes(pshard, [p for _, p in part])
            for ref, envelope in zip(refs, got, strict=True):
                if envelope is None or ref in found:
                    continue
                try:
                    traceparent = open_envelope(envelope, ref[1]).context.get("traceparent")
                except DecodeError:
                    continue
                if traceparent:
                    found[ref] = traceparent
        if not found:
            return items
        extra = {PARENT_SPANS_KEY: " ".join(found.get(ref, "-") for ref in parents)}
        return [(i, add_to_context(envelope, extra), ms) for i, envelope, ms in items]
