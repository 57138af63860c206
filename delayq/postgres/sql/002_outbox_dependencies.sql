-- delayq.postgres migration 2: outbox rows that wait for parents (after=[...]).
--
-- Outbox.enqueue_*(conn, ..., after=[(ParentType, parent_id), ...],
-- on_parent_failure=...) stores the parents of a row in two arrays of the same
-- length (parent i is (parent_types[i], parent_ids[i]): wire name, id) and the
-- policy; rows without parents leave all three NULL, as every row written before
-- this migration does. The relay enqueues a row with parents through
-- EventService.enqueue_envelopes(..., after=..., on_parent_failure=...), and only
-- once no earlier row of any of its parents is left in the table (so a child
-- committed after its parent reaches Redis after it). Adding nullable columns
-- without a default rewrites nothing.

ALTER TABLE {schema}.outbox
    ADD COLUMN parent_types      text[],
    ADD COLUMN parent_ids        text[],
    ADD COLUMN on_parent_failure text,
    ADD CONSTRAINT outbox_parents_check CHECK (
        (parent_ids IS NULL AND parent_types IS NULL AND on_parent_failure IS NULL)
        OR (cardinality(parent_ids) > 0
            AND cardinality(parent_ids) = cardinality(parent_types)
            AND on_parent_failure IN ('fail', 'run', 'skip')));

-- Rows with parents, for the relay's "are children waiting?" look (empty, hence
-- free, while nobody uses after=).
CREATE INDEX outbox_children_idx ON {schema}.outbox (id) WHERE parent_ids IS NOT NULL;
