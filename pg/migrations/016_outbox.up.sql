-- An outbox at the price of an INSERT: INSERT INTO jetgres.outbox (subject, data, headers)
-- VALUES …, or COPY jetgres.outbox (subject, data, headers) FROM …, in the application's own
-- transaction, for bulk and high-rate producers. jetgres.publish checks each message at the
-- call (its route, subject, size and headers); the outbox checks nothing there, so a row
-- costs what a row of the application's own table costs, and everything is decided when the
-- mover takes the row: a message that cannot be stored (an invalid subject, no stream takes
-- it, headers that are not NATS headers, or anything the stream refuses) goes to
-- jetgres.outbox_rejected with the reason, in the move's own transaction, and is counted in
-- jetgres_sql_publish_refused_total. The same holds for what jetgres.publish staged and its
-- stream then refused.
--
-- Outbox rows join the staged rows of jetgres.publish in one order, (xid, call), and one
-- progress (jetgres.staging): the mover takes them through the same snapshot-bounded moves,
-- exactly once.
--
-- Like the staging tables, two tables take turns and are truncated once drained, so that no
-- moved row is ever deleted and nothing waits for VACUUM. The staging target is a row that
-- jetgres.publish reads; a column default cannot read a table, and one computed from the
-- clock would add its own work to every row, so the outbox's turn is a bit of the call
-- number that every row takes anyway: bit 20 of jetgres.staged_call. The mover turns
-- it by advancing the sequence to the next multiple of 2^20 (jetgres.outbox_rotate), as it
-- switches the staging target; a session whose cached numbers are of the old turn puts up
-- to that cache's rows into the old table. The turn is only where rows go: what makes a
-- truncation safe is the lock taken without waiting and the drained check under it, as for
-- the staging tables.
CREATE TABLE jetgres.outbox (
    subject text   NOT NULL,
    data    bytea  NOT NULL DEFAULT '',
    headers jsonb,
    xid     xid8   NOT NULL DEFAULT pg_current_xact_id(),
    call    bigint NOT NULL DEFAULT nextval('jetgres.staged_call')
) PARTITION BY LIST (((call >> 20) & 1));
CREATE TABLE jetgres.outbox_0 PARTITION OF jetgres.outbox FOR VALUES IN (0);
CREATE TABLE jetgres.outbox_1 PARTITION OF jetgres.outbox FOR VALUES IN (1);
CREATE INDEX outbox_order ON jetgres.outbox (xid, call);

-- When the outbox's turn last changed.
ALTER TABLE jetgres.staging_target ADD COLUMN outbox_switched timestamptz NOT NULL DEFAULT now();

-- A statement that inserted wakes the mover as jetgres.publish does (migration 007): only
-- while no mover is awake, once per statement (a COPY of a million rows notifies once).
CREATE FUNCTION jetgres.outbox_notify()
RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF pg_try_advisory_lock_shared(7666661928317842179) THEN
        PERFORM pg_advisory_unlock_shared(7666661928317842179);
        PERFORM pg_notify('jetgres_staged', '');
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER outbox_notify AFTER INSERT ON jetgres.outbox
    FOR EACH STATEMENT EXECUTE FUNCTION jetgres.outbox_notify();

-- What was published with jetgres.publish or into jetgres.outbox and is not in a stream, with
-- why. jetgres never deletes from it: the application reads it, acts and deletes.
CREATE TABLE jetgres.outbox_rejected (
    rejected_at timestamptz NOT NULL DEFAULT now(),
    source      text        NOT NULL CHECK (source IN ('outbox', 'publish')),
    stream      text,       -- the stream that refused it; NULL when none took the subject
    subject     text        NOT NULL,
    headers     jsonb,
    data        bytea       NOT NULL,
    reason      text        NOT NULL, -- the reason label of jetgres_sql_publish_refused_total
    detail      text
);
CREATE INDEX outbox_rejected_at ON jetgres.outbox_rejected (rejected_at);

-- The headers of an outbox row as NATS header bytes, or why they cannot be.
CREATE FUNCTION jetgres.outbox_headers(p_headers jsonb, OUT hdr bytea, OUT problem text)
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    hdr := jetgres.headers_bytes(p_headers);
EXCEPTION WHEN SQLSTATE 'JG004' THEN
    problem := SQLERRM;
END $$;

-- Every staged and outbox row the mover may take now, in the order it takes them (see
-- migration 010 for why each table is read in index order up to p_limit). An outbox row
-- is routed here, as jetgres.publish routes at the call: stream_id is NULL when no stream
-- takes its subject, and problem says what is wrong with it before any stream looks (a
-- reason label of jetgres_sql_publish_refused_total), detail how.
DROP FUNCTION jetgres.staged_ready(integer);
CREATE FUNCTION jetgres.staged_ready(p_limit integer)
RETURNS TABLE (xid xid8, call bigint, stream_id bigint, subject text, hdr bytea, data bytea,
               outbox boolean, headers jsonb, problem text, detail text)
LANGUAGE sql STABLE AS $$
    SELECT r.xid, r.call, coalesce(r.stream_id, rt.stream_id), r.subject, coalesce(r.hdr, oh.hdr),
           r.data, r.outbox, r.headers,
           CASE WHEN NOT r.outbox THEN NULL
                WHEN NOT jetgres.valid_publish_subject(r.subject) THEN 'invalid_subject'
                WHEN rt.stream_id IS NULL THEN 'no_stream'
                WHEN oh.problem IS NOT NULL THEN 'bad_headers'
           END,
           oh.problem
    FROM (
        (SELECT s.xid, s.call, s.stream_id, s.subject, s.hdr, s.data, false AS outbox, NULL::jsonb AS headers
         FROM jetgres.staged_0 s
         WHERE (s.xid, s.call) > ((SELECT st.moved_xid FROM jetgres.staging st), (SELECT st.moved_call FROM jetgres.staging st))
           AND s.xid < pg_snapshot_xmin(pg_current_snapshot())
         ORDER BY s.xid, s.call
         LIMIT p_limit)
        UNION ALL
        (SELECT s.xid, s.call, s.stream_id, s.subject, s.hdr, s.data, false, NULL
         FROM jetgres.staged_1 s
         WHERE (s.xid, s.call) > ((SELECT st.moved_xid FROM jetgres.staging st), (SELECT st.moved_call FROM jetgres.staging st))
           AND s.xid < pg_snapshot_xmin(pg_current_snapshot())
         ORDER BY s.xid, s.call
         LIMIT p_limit)
        UNION ALL
        (SELECT o.xid, o.call, NULL, o.subject, NULL, o.data, true, o.headers
         FROM jetgres.outbox_0 o
         WHERE (o.xid, o.call) > ((SELECT st.moved_xid FROM jetgres.staging st), (SELECT st.moved_call FROM jetgres.staging st))
           AND o.xid < pg_snapshot_xmin(pg_current_snapshot())
         ORDER BY o.xid, o.call
         LIMIT p_limit)
        UNION ALL
        (SELECT o.xid, o.call, NULL, o.subject, NULL, o.data, true, o.headers
         FROM jetgres.outbox_1 o
         WHERE (o.xid, o.call) > ((SELECT st.moved_xid FROM jetgres.staging st), (SELECT st.moved_call FROM jetgres.staging st))
           AND o.xid < pg_snapshot_xmin(pg_current_snapshot())
         ORDER BY o.xid, o.call
         LIMIT p_limit)
        ORDER BY 1, 2
        LIMIT p_limit
    ) r
    LEFT JOIN LATERAL (
        SELECT rr.stream_id FROM jetgres.stream_routes rr
        WHERE r.outbox AND rr.head IN (split_part(r.subject, '.', 1), '*', '>') AND r.subject ~ rr.pattern
        LIMIT 1
    ) rt ON true
    LEFT JOIN LATERAL (
        SELECT h.hdr, h.problem FROM jetgres.outbox_headers(r.headers) h
        WHERE r.outbox AND r.headers IS NOT NULL
        OFFSET 0 -- kept a subquery, so that its WHERE gates the call (an exception block)
    ) oh ON true
    ORDER BY r.xid, r.call
$$;

-- One step of the outbox's rotation, beside jetgres.staging_rotate: truncate the table that
-- is not the turn's once it is drained and no transaction holds it, or else turn once the
-- turn's table has held rows for p_period. Returns what it did: 'truncated', 'switched',
-- 'busy' (a transaction still holds the other table), 'undrained' or 'idle'.
CREATE FUNCTION jetgres.outbox_rotate(p_period interval)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    last      bigint := (SELECT s.last_value FROM jetgres.staged_call s);
    turn      bigint := (last >> 20) & 1;
    other     text := format('outbox_%s', 1 - turn);
    progress  jetgres.staging;
    left_over boolean;
BEGIN
    IF pg_relation_size(format('jetgres.%I', other)::regclass) > 0 THEN
        BEGIN
            EXECUTE format('LOCK TABLE jetgres.%I IN ACCESS EXCLUSIVE MODE NOWAIT', other);
        EXCEPTION WHEN lock_not_available THEN
            RETURN 'busy';
        END;
        SELECT * INTO progress FROM jetgres.staging;
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM jetgres.%I o WHERE (o.xid, o.call) > ($1, $2))', other)
            INTO left_over USING progress.moved_xid, progress.moved_call;
        IF left_over THEN
            RETURN 'undrained';
        END IF;
        EXECUTE format('TRUNCATE jetgres.%I', other);
        RETURN 'truncated';
    END IF;
    IF pg_relation_size(format('jetgres.outbox_%s', turn)::regclass) = 0
       OR now() - (SELECT t.outbox_switched FROM jetgres.staging_target t) < p_period THEN
        RETURN 'idle';
    END IF;
    PERFORM setval('jetgres.staged_call', ((last >> 20) + 1) << 20);
    UPDATE jetgres.staging_target SET outbox_switched = now();
    RETURN 'switched';
END $$;

REVOKE ALL ON TABLE jetgres.outbox, jetgres.outbox_0, jetgres.outbox_1, jetgres.outbox_rejected FROM PUBLIC;

-- The outbox is a publisher's, and so is reading what was rejected and deleting it once
-- dealt with.
CREATE OR REPLACE FUNCTION jetgres.grant_sql_roles()
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'jetgres_publisher') THEN
        GRANT USAGE ON SCHEMA jetgres TO jetgres_publisher;
        GRANT EXECUTE ON FUNCTION jetgres.publish(text, bytea, jsonb), jetgres.publish(text, text, jsonb),
            jetgres.publish(text, jsonb, jsonb) TO jetgres_publisher;
        GRANT INSERT (subject, data, headers) ON jetgres.outbox TO jetgres_publisher;
        GRANT USAGE ON SEQUENCE jetgres.staged_call TO jetgres_publisher;
        GRANT SELECT, DELETE ON jetgres.outbox_rejected TO jetgres_publisher;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'jetgres_reader') THEN
        GRANT USAGE ON SCHEMA jetgres TO jetgres_reader;
        GRANT EXECUTE ON FUNCTION jetgres.messages(text, bigint, text, bigint) TO jetgres_reader;
        GRANT SELECT ON jetgres.stream_list, jetgres.consumer_list TO jetgres_reader;
    END IF;
END $$;

SELECT jetgres.grant_sql_roles();
