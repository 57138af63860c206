"""Event type names and the envelope codec (issue 2: Event, serializer, bad stored entries)."""

from __future__ import annotations

import msgspec
import pytest
from core_support import Recorder, ServicePool

from delayq import DecodeError, Event, EventService, event_name
from delayq.codec import Codec, add_to_context
from delayq.context import AFTER_KEY


class CodecJob(Event, event_name="core-codec-job"):
    """An event with a few field types, for round trips."""

    n: int
    text: str = ""
    tags: list[str] = []
    ratio: float | None = None


class CodecOther(Event, event_name="core-codec-other"):
    """A second type with a different shape."""

    flag: bool


@pytest.fixture
async def services(redis_url: str, prefix: str):
    pool = ServicePool(redis_url, prefix)
    yield pool
    await pool.aclose()


# --------------------------------------------------------------------------- names


def test_default_name_is_qualname() -> None:
    class Plain(Event):
        x: int

    assert Plain.event_name == Plain.__qualname__
    assert Plain.event_name.endswith("<locals>.Plain")
    assert event_name(Plain) == Plain.__qualname__
    assert event_name(Plain(id="a", x=1)) == Plain.__qualname__


def test_explicit_name_by_keyword_and_class_variable() -> None:
    class ByKeyword(Event, event_name="core-names-keyword"):
        x: int

    class ByVariable(Event):
        event_name = "core-names-variable"
        x: int

    assert event_name(ByKeyword) == "core-names-keyword"
    assert event_name(ByVariable) == "core-names-variable"
    # the class variable is a name, not a field on the wire
    assert {f.name for f in msgspec.structs.fields(ByVariable)} == {"id", "x"}
    assert msgspec.json.decode(msgspec.json.encode(ByVariable(id="i", x=2))) == {"id": "i", "x": 2}


def test_subclass_does_not_inherit_an_explicit_name() -> None:
    class Parent(Event, event_name="core-names-parent"):
        x: int

    class ParentVar(Event):
        event_name = "core-names-parent-var"

    class Child(Parent):
        y: int = 0

    class ChildVar(ParentVar):
        pass

    assert Parent.event_name == "core-names-parent"
    assert Child.event_name == Child.__qualname__
    assert ChildVar.event_name == ChildVar.__qualname__


def test_two_classes_with_one_name_raise() -> None:
    class First(Event, event_name="core-names-taken"):
        x: int

    with pytest.raises(TypeError, match="core-names-taken"):

        class Second(Event, event_name="core-names-taken"):
            y: int

    with pytest.raises(TypeError, match="core-names-taken"):

        class Third(Event):
            event_name = "core-names-taken"

    # the name stays with the first class
    assert First.event_name == "core-names-taken"


async def test_service_refuses_a_redefined_class_under_a_used_name(services) -> None:
    """A class defined again under the same name (a reload) must not share a queue silently."""
    made = []
    for _ in range(2):

        class Reloaded(Event):
            x: int

        made.append(Reloaded)
    old, new = made
    assert old is not new and old.event_name == new.event_name
    service = services.make()
    service.add_handler(old, Recorder())
    with pytest.raises(ValueError, match="used by both"):
        await service.enqueue_with_delay(new(id="a", x=1), 0)
    with pytest.raises(ValueError, match="used by both"):
        await service.cancel(new, "a")


@pytest.mark.parametrize(
    "bad", ["a{b", "b}", "{x}", "", "with space", "tab\there", "nl\n", "x" * 201]
)
def test_invalid_names_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):

        class Bad(Event, event_name=bad):
            x: int


def test_non_str_name_is_refused() -> None:
    with pytest.raises(TypeError):

        class Bad(Event, event_name=42):
            x: int


def test_event_name_of_non_events() -> None:
    with pytest.raises(TypeError):
        event_name(Event)
    with pytest.raises(TypeError):
        event_name(int)  # type: ignore[arg-type]


async def test_invalid_prefix_is_refused(redis_url: str) -> None:
    for bad in ("a{b", "", "a b"):
        with pytest.raises(ValueError):
            EventService.from_url(redis_url, prefix=bad)


# --------------------------------------------------------------------------- codec


@pytest.mark.parametrize("serializer", ["json", "msgpack"])
def test_round_trip(serializer: str) -> None:
    codec = Codec(serializer)  # type: ignore[arg-type]
    event = CodecJob(id="ü-1", n=-5, text="päyload \x00 \u2603", tags=["a", "b"], ratio=0.25)
    data = codec.encode(event, {"request_id": "r-1", "ü": "✓"})
    assert isinstance(data, bytes)
    assert (data[:1] == b"[") == (serializer == "json")
    decoded, context = codec.decode(data, CodecJob, "ü-1")
    assert decoded == event
    assert context == {"request_id": "r-1", "ü": "✓"}
    # no context: an empty mapping comes back
    decoded, context = codec.decode(codec.encode(CodecJob(id="x", n=1)), CodecJob, "x")
    assert decoded == CodecJob(id="x", n=1)
    assert context == {}


@pytest.mark.parametrize("serializer", ["json", "msgpack"])
@pytest.mark.parametrize("context", [None, {"k": "v"}])
def test_a_waiting_childs_prefix_adds_the_after_mark(
    serializer: str, context: dict[str, str]
) -> None:
    # enqueue.lua stores a waiting child's replacing envelope behind b"\xc1" (codec.py)
    codec = Codec(serializer)  # type: ignore[arg-type]
    event = CodecJob(id="c", n=3)
    data = b"\xc1" + codec.encode(event, context)
    decoded, got = codec.decode(data, CodecJob, "c")
    assert decoded == event and got == {**(context or {}), AFTER_KEY: "1"}
    merged = add_to_context(data, {"x": "y"})
    assert merged[:1] != b"\xc1"
    assert codec.decode(merged, CodecJob, "c")[1] == {**(context or {}), AFTER_KEY: "1", "x": "y"}


@pytest.mark.parametrize(("writer", "reader"), [("msgpack", "json"), ("json", "msgpack")])
def test_format_is_detected_on_decode(writer: str, reader: str) -> None:
    event = CodecJob(id="cross", n=7, tags=["t"])
    data = Codec(writer).encode(event, {"k": "v"})  # type: ignore[arg-type]
    assert Codec(reader).decode(data, CodecJob, "cross") == (event, {"k": "v"})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "garbage",
    [
        b"",
        b"garbage",
        b"\xff\xfe\x00",
        b"[1, 2",  # truncated JSON
        b'["not an object", null, 0]',  # payload of the wrong shape
        b'[{"id": "x"}, null, 0]',  # payload missing a required field
        b'[{"id": "x", "n": "seven"}, null, 0]',  # wrong field type
        b'[{"id": "x", "n": 1}, {"k": 1}, 0]',  # context values must be str
        b"\x93\xc1\xc1\xc1",  # msgpack array of reserved bytes
        b"\x92\x01\x02",  # msgpack envelope whose payload is not an event
    ],
)
def test_garbage_raises_decode_error(garbage: bytes) -> None:
    for serializer in ("json", "msgpack"):
        with pytest.raises(DecodeError):
            Codec(serializer).decode(garbage, CodecJob, "x")  # type: ignore[arg-type]


class CodecPositional(Event, event_name="core-codec-positional", array_like=True):
    """Encodes as an array: its id cannot be cut out, so it keeps the whole payload."""

    n: int


class CodecWide(Event, event_name="core-codec-wide"):
    """Fifteen fields besides the id: the MessagePack map header grows on decode."""

    f1: int = 1
    f2: int = 2
    f3: int = 3
    f4: int = 4
    f5: int = 5
    f6: int = 6
    f7: int = 7
    f8: int = 8
    f9: int = 9
    f10: int = 10
    f11: int = 11
    f12: int = 12
    f13: int = 13
    f14: int = 14
    f15: int = 15


@pytest.mark.parametrize("serializer", ["json", "msgpack"])
@pytest.mark.parametrize(
    "event",
    [
        CodecJob(id='q"uote\\ \u2603 \x01', n=1),
        CodecJob(id="x" * 300, n=2, tags=["id", '"id":"x"}']),
        CodecWide(id="wide"),
        CodecOther(id="o", flag=True),
    ],
)
def test_the_id_is_stored_once(serializer: str, event: Event) -> None:
    """The envelope leaves the id out (it is the hash field) and decoding puts it back."""
    codec = Codec(serializer)  # type: ignore[arg-type]
    data = codec.encode(event)
    whole = msgspec.json.encode(event) if serializer == "json" else msgspec.msgpack.encode(event)
    id_bytes = msgspec.json.encode(event.id) if serializer == "json" else event.id.encode()
    assert data.count(id_bytes) == whole.count(id_bytes) - 1
    for reader in ("json", "msgpack"):
        decoded, _ = Codec(reader).decode(data, type(event), event.id.encode())  # type: ignore[arg-type]
        assert decoded == event
    # decoded under another id, the event has that id: the hash field is the truth
    assert Codec().decode(data, type(event), "other")[0].id == "other"


@pytest.mark.parametrize("serializer", ["json", "msgpack"])
def test_envelopes_of_the_earlier_layout_still_decode(serializer: str) -> None:
    """``[payload with id, context, enqueued_at]`` (the earlier layout) and array_like types."""
    enc = msgspec.json.encode if serializer == "json" else msgspec.msgpack.encode
    event = CodecJob(id="old", n=3)
    for data in (
        enc([msgspec.Raw(enc(event)), {"k": "v"}, 1_700_000_000_000]),
        enc([msgspec.Raw(enc(event)), None, 0]),
        enc([msgspec.Raw(enc(event))]),
    ):
        decoded, context = Codec().decode(data, CodecJob, "old")
        assert decoded == event
        assert context in ({"k": "v"}, {})
    positional = CodecPositional(id="p", n=4)
    data = Codec(serializer).encode(positional, {"k": "v"})  # type: ignore[arg-type]
    assert Codec().decode(data, CodecPositional, "p") == (positional, {"k": "v"})


def test_envelope_size_for_a_100_byte_field() -> None:
    """What the memory benchmark stores per event (see benchmarks/RESULTS.md)."""

    class Sized(Event, event_name="core-codec-sized"):
        payload: str = ""

    event = Sized(id="M0000001", payload="x" * 100)
    assert len(Codec("msgpack").encode(event)) <= 124  # one 128-byte allocation in Redis
    assert len(Codec("json").encode(event)) < len(Codec("json").encode(event, {"k": "v"}))


def test_unknown_serializer_is_refused() -> None:
    with pytest.raises(ValueError, match="serializer"):
        Codec("pickle")  # type: ignore[arg-type]


@pytest.mark.parametrize(("writer", "reader"), [("msgpack", "json"), ("json", "msgpack")])
async def test_service_reads_events_written_in_the_other_format(
    services, wait_for, writer: str, reader: str
) -> None:
    producer = services.producer(serializer=writer)
    events = [CodecJob(id=f"e{i}", n=i, tags=[str(i)]) for i in range(5)]
    for event in events:
        assert await producer.enqueue_with_delay(event, 0, context={"from": writer})
    assert await producer.enqueue_with_delay(CodecOther(id="o", flag=True), 0.05)

    consumer = await services.start(serializer=reader)
    jobs, others = Recorder(), Recorder()
    consumer.add_handler(CodecJob, jobs, concurrency=5)
    consumer.add_handler(CodecOther, others)
    await wait_for(lambda: jobs.finished == 5 and others.finished == 1, timeout=10)
    assert sorted(jobs.events, key=lambda e: e.n) == events
    assert all(ctx == {"from": writer} for ctx in jobs.contexts)
    assert others.events == [CodecOther(id="o", flag=True)]
