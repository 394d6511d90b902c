-- jetgres.next, ack and ack_through read jetgres.msgs in statements that plpgsql keeps
-- prepared in the caller's session. After five calls PostgreSQL may run such a statement
-- with a generic plan, and a generic plan of jetgres.msgs locks and opens every partition,
-- every chunk of every stream, at each call, because the stream it reads is a parameter.
-- Measured on PostgreSQL 15 with 256 streams: 798 locks and 40-50 ms a call, where a plan
-- made for the call's own values opens the stream's chunks only, takes 37 locks and 2-4 ms.
-- So the reads go through two functions that plan them for each call (EXECUTE), as
-- jetgres's own reads are planned (pg/read.go, customPlan); the other statements keep their
-- cached plans, which planning every statement of these functions for each call would cost
-- (twice the time of a call of 100 messages).

CREATE OR REPLACE FUNCTION jetgres.sqlc_msgs(p_stream bigint, p_after bigint, p_through bigint, p_pattern text, p_limit bigint)
RETURNS TABLE (seq bigint, subject text, hdr bytea, data bytea, ts bigint)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY EXECUTE $sql$
        SELECT m.seq, m.subject, m.hdr, m.data, m.ts
        FROM jetgres.msgs m
        WHERE m.stream_id = $1
          AND m.chunk >= coalesce((SELECT max(c.chunk) FROM jetgres.chunks c
                                   WHERE c.stream_id = $1 AND c.first_seq <= $2 + 1), 0)
          AND m.seq > greatest($2, (SELECT st.first_seq - 1 FROM jetgres.stream_state st WHERE st.stream_id = $1))
          AND m.seq <= $3
          AND ($4 IS NULL OR m.subject ~ $4)
          -- Probed row by row only when the stream has a tombstone in the range at all.
          AND ((SELECT NOT EXISTS (SELECT 1 FROM jetgres.deleted d WHERE d.stream_id = $1 AND d.seq > $2))
               OR NOT EXISTS (SELECT 1 FROM jetgres.deleted d WHERE d.stream_id = $1 AND d.seq = m.seq))
        ORDER BY m.seq
        LIMIT $5 $sql$
    USING p_stream, p_after, p_through, p_pattern, p_limit;
END $$;

-- The messages of a stream at the given sequences, for the redeliveries of jetgres.next.
CREATE FUNCTION jetgres.sqlc_msgs_at(p_stream bigint, p_seqs bigint[])
RETURNS TABLE (seq bigint, subject text, hdr bytea, data bytea, ts bigint)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY EXECUTE $sql$
        SELECT m.seq, m.subject, m.hdr, m.data, m.ts FROM jetgres.msgs m
        WHERE m.stream_id = $1 AND m.seq = ANY($2) $sql$
    USING p_stream, p_seqs;
END $$;

REVOKE ALL ON FUNCTION jetgres.sqlc_msgs_at(bigint, bigint[]) FROM PUBLIC;

CREATE OR REPLACE FUNCTION jetgres.next(stream text, consumer text, max integer DEFAULT 100, nowait boolean DEFAULT false)
RETURNS TABLE (seq bigint, subject text, headers jsonb, data bytea, published timestamptz, delivered integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
-- Chunk tables filling under load have no statistics yet: the planner would read every row
-- after the cursor and sort them, where walking the sequence index stops after max rows.
SET search_path = pg_catalog, pg_temp SET enable_bitmapscan = off SET enable_sort = off SET jit = off AS $$
#variable_conflict use_column
DECLARE
    e      record;
    v_left bigint := greatest(coalesce(next.max, 100), 0);
    v_maxd integer;
    v_n    bigint := 0;
    v_new  bigint;
    v_top  bigint;
    v_from bigint;
BEGIN
    e := jetgres.sqlc_enter(next.stream, next.consumer, NOT coalesce(next.nowait, false));
    IF e.o_id IS NULL OR v_left = 0 THEN
        RETURN;
    END IF;
    v_maxd := coalesce((e.o_config ->> 'max_deliver')::integer, -1);
    -- Messages due again first, in stream order, each looked up by its sequence.
    IF EXISTS (SELECT 1 FROM jetgres.sql_pending d WHERE d.consumer_id = e.o_id AND NOT d.acked
               AND d.due <= clock_timestamp()) THEN
        RETURN QUERY
            WITH r AS (
                UPDATE jetgres.sql_pending p
                SET delivered = p.delivered + 1, due = clock_timestamp() + jetgres.sqlc_wait(e.o_config, p.delivered + 1, false),
                    attempt = e.o_attempt
                WHERE p.consumer_id = e.o_id AND p.seq IN (
                    SELECT d.seq FROM jetgres.sql_pending d
                    WHERE d.consumer_id = e.o_id AND NOT d.acked AND d.due <= clock_timestamp()
                      AND (v_maxd <= 0 OR d.delivered < v_maxd)
                    ORDER BY d.seq LIMIT v_left)
                RETURNING p.seq, p.delivered)
            SELECT m.seq, m.subject, CASE WHEN m.hdr IS NOT NULL THEN jetgres.headers_jsonb(m.hdr) END, m.data,
                   to_timestamp(m.ts / 1e9::float8), r.delivered
            FROM r JOIN jetgres.sqlc_msgs_at(e.o_stream, ARRAY(SELECT r.seq FROM r)) m ON m.seq = r.seq
            ORDER BY m.seq;
        GET DIAGNOSTICS v_n = ROW_COUNT;
    END IF;
    v_left := v_left - v_n;
    IF v_n > 0 THEN
        v_top := (SELECT max(p.seq) FROM jetgres.sql_pending p WHERE p.consumer_id = e.o_id AND p.attempt = e.o_attempt);
        UPDATE jetgres.sql_consumers q SET deliveries = q.deliveries + v_n, last_delivered = clock_timestamp()
        WHERE q.consumer_id = e.o_id;
    END IF;
    IF v_left > 0 THEN
        -- One statement reads the new messages and records how far it handed out; the
        -- start is a parameter of it, so that the chunks before it are pruned once.
        v_from := (SELECT q.handed FROM jetgres.sql_consumers q WHERE q.consumer_id = e.o_id);
        RETURN QUERY
            WITH m AS MATERIALIZED (
                SELECT x.seq, x.subject, x.hdr, x.data, x.ts
                FROM jetgres.sqlc_msgs(e.o_stream, v_from, 9223372036854775807, e.o_pattern, v_left) x),
            u AS (
                UPDATE jetgres.sql_consumers q
                SET handed = (SELECT max(m.seq) FROM m), handed_at = clock_timestamp(),
                    deliveries = q.deliveries + (SELECT count(*) FROM m), last_delivered = clock_timestamp()
                WHERE q.consumer_id = e.o_id AND EXISTS (SELECT 1 FROM m))
            SELECT m.seq, m.subject, CASE WHEN m.hdr IS NOT NULL THEN jetgres.headers_jsonb(m.hdr) END, m.data, to_timestamp(m.ts / 1e9::float8), 1
            FROM m ORDER BY m.seq;
        GET DIAGNOSTICS v_new = ROW_COUNT;
        IF v_new > 0 THEN
            v_n := v_n + v_new;
            v_top := greatest(v_top, (SELECT q.handed FROM jetgres.sql_consumers q WHERE q.consumer_id = e.o_id));
        END IF;
    END IF;
    IF v_n = 0 THEN
        RETURN;
    END IF;
    IF v_top IS NOT NULL THEN
        -- Not undone by a rollback: what the next attempt counts as delivered if this one fails.
        PERFORM setval(format('jetgres.sqlc_reach_%s', e.o_id)::regclass,
            greatest(pg_sequence_last_value(format('jetgres.sqlc_reach_%s', e.o_id)::regclass), v_top));
    END IF;
    IF e.o_config ->> 'ack_policy' = 'none' THEN
        PERFORM jetgres.sqlc_settle(e.o_id, e.o_stream, e.o_pattern, e.o_ranged, e.o_attempt, 9223372036854775807);
    END IF;
END $$;
