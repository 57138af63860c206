-- delayq.postgres migration 1: the outbox and the inbox.
--
-- The placeholders in braces stand for the schema name (validated, then quoted)
-- and the LISTEN/NOTIFY channel of the outbox ('<schema>_outbox'). Render it with
-- delayq.postgres.schema_sql(schema) or apply it with delayq.postgres.migrate(...).
-- Needs PostgreSQL 11 or newer.

-- Events waiting for their transaction's commit to reach Redis. A relay reads
-- committed rows in id order (FOR UPDATE SKIP LOCKED), enqueues them and deletes them.
CREATE TABLE {schema}.outbox (
    id               bigserial   PRIMARY KEY,
    event_type       text        NOT NULL,  -- the event type's wire name
    event_id         text        NOT NULL,
    envelope         bytea       NOT NULL,  -- encoded by delayq.codec.Codec at insert
    due_ms           bigint      NOT NULL,  -- a delay in ms, or unix ms when absolute
    absolute         boolean     NOT NULL DEFAULT false,
    replace_existing boolean     NOT NULL DEFAULT false,
    created_at       timestamptz NOT NULL DEFAULT now()
);

-- Rows of one (type, id) are relayed in insertion order, even by several relays:
-- a row waits while an earlier row of the same event is still in the table.
CREATE INDEX outbox_event_idx ON {schema}.outbox (event_type, event_id, id);

-- One notification per inserting statement, delivered at commit (never for a
-- rolled-back transaction): it wakes the relays at once. They also poll.
CREATE FUNCTION {schema}.outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{channel}', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER outbox_notify AFTER INSERT ON {schema}.outbox
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.outbox_notify();

-- Deliveries whose handler transaction committed: one row per version of an event.
CREATE TABLE {schema}.inbox (
    event_type text        NOT NULL,
    event_id   text        NOT NULL,
    version    text        NOT NULL,  -- Delivery.version: a digest of the stored envelope
    handled_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (event_type, event_id, version)
);

-- for pruning rows older than the retention
CREATE INDEX inbox_handled_at_idx ON {schema}.inbox (handled_at);
