-- Reading and acking a consumer in SQL, inside the application's own transaction, so that
-- the ack commits together with the application's writes: exactly-once processing.
--
-- A consumer is read either over NATS or in SQL, never both: jetgres.read_in_sql switches
-- it to SQL (a row in jetgres.sql_consumers) and jetgres.read_over_nats switches it back.
-- Replicas neither claim nor keep serving a consumer that has such a row, and give its
-- advisory lock back (pg.Ownership). jetgres.next takes that same lock, transaction-scoped,
-- after the row lock: while a replica still serves the consumer, the call fails with JG012
-- instead of reading it beside the replica.
--
-- One transaction at a time holds a consumer: jetgres.next, jetgres.ack and
-- jetgres.ack_through lock its jetgres.sql_consumers row FOR UPDATE (next with nowait skips
-- it instead and returns nothing). Each transaction that takes the consumer is an attempt.
--
-- What a committed attempt did is in jetgres.sql_consumers (the highest sequence it handed
-- out, the deliveries), jetgres.sql_pending (messages handed out and not acked, acked out of
-- order, or delivered more than once) and the consumer's row (the ack floor, which NATS,
-- retention and consumer info read as they would for a consumer served over NATS). None of
-- that survives a rollback, so what an attempt that did not commit handed out is recorded
-- where a rollback cannot undo it: in two sequences per consumer (setval is not
-- transactional). jetgres.sqlc_attempt_<id> numbers the attempts, jetgres.sqlc_reach_<id>
-- holds the highest sequence handed out by the attempts since the last one that committed.
-- An attempt that finds the attempt counter k past the last committed attempt's number + 1
-- knows that k attempts rolled back or died, and counts every unacked message up to the
-- reach as delivered k more times: exact for one such attempt, or several that took the
-- same messages; an upper bound otherwise (an attempt that took fewer), so that max_deliver
-- never lets a message through more often than it says. A rollback is a NAK: the messages
-- are handed out again at once, or after the backoff for their delivery count.
--
-- Errors raised (SQLSTATE, class JG):
--   JG010  no such stream or consumer
--   JG011  the consumer is read over NATS: jetgres.read_in_sql first
--   JG012  a jetgres replica still serves the consumer over NATS (it lets go within a few
--          seconds of jetgres.read_in_sql): try again
-- The NATS side of a consumer read in SQL gets 409 Consumer Is Read In SQL for a pull.

CREATE TABLE jetgres.sql_consumers (
    consumer_id    bigint      PRIMARY KEY REFERENCES jetgres.consumers (id) ON DELETE CASCADE,
    attempt        bigint      NOT NULL DEFAULT 0,  -- the last committed attempt's number
    handed         bigint      NOT NULL,            -- highest sequence committed attempts handed out
    handed_at      timestamptz NOT NULL DEFAULT now(),
    deliveries     bigint      NOT NULL DEFAULT 0,  -- delivered.consumer_seq
    last_delivered timestamptz,
    last_acked     timestamptz,
    -- jetgres.sqlc_pattern of the consumer's configuration, which cannot change while it is
    -- read in SQL: updates go to a replica serving it.
    pattern        text
) WITH (fillfactor = 50);

-- Messages above the ack floor that were handed out and not acked, acked out of order, or
-- handed out more than once. A message up to sql_consumers.handed that has no row here and
-- is above the floor was handed out once by the transaction that holds the consumer now.
CREATE TABLE jetgres.sql_pending (
    consumer_id bigint      NOT NULL REFERENCES jetgres.sql_consumers (consumer_id) ON DELETE CASCADE,
    seq         bigint      NOT NULL,
    delivered   integer     NOT NULL,
    acked       boolean     NOT NULL DEFAULT false,
    due         timestamptz NOT NULL, -- when an unacked one may be handed out again
    attempt     bigint      NOT NULL DEFAULT 0, -- the attempt that last handed it out
    PRIMARY KEY (consumer_id, seq)
);

CREATE FUNCTION jetgres.sqlc_dropped()
RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('DROP SEQUENCE IF EXISTS jetgres.%I, jetgres.%I',
        'sqlc_attempt_' || OLD.consumer_id, 'sqlc_reach_' || OLD.consumer_id);
    RETURN NULL;
END $$;

CREATE TRIGGER sql_consumers_dropped AFTER DELETE ON jetgres.sql_consumers
    FOR EACH ROW EXECUTE FUNCTION jetgres.sqlc_dropped();

-- A consumer's filter subjects as one anchored regular expression, NULL for none.
CREATE FUNCTION jetgres.sqlc_pattern(p_config jsonb)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN bool_or(f = '>') THEN NULL
                ELSE string_agg('(?:' || jetgres.subject_regexp(f) || ')', '|') END
    FROM (SELECT p_config ->> 'filter_subject' AS f
          UNION ALL
          SELECT jsonb_array_elements_text(coalesce(p_config -> 'filter_subjects', '[]'))) x
    WHERE f IS NOT NULL AND f <> ''
$$;

-- How long after its delivery number p_n a message not acked may be handed out again: its
-- backoff step if the consumer has backoff, else ack_wait (30 s by default) when p_nak is
-- false; at once, or after the backoff step, for a NAK (a rollback).
CREATE FUNCTION jetgres.sqlc_wait(p_config jsonb, p_n integer, p_nak boolean)
RETURNS interval
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT make_interval(secs => CASE
        WHEN jsonb_array_length(coalesce(p_config -> 'backoff', '[]')) > 0
            THEN (p_config -> 'backoff' ->> (least(greatest(p_n, 1), jsonb_array_length(p_config -> 'backoff')) - 1))::float8 / 1e9
        WHEN p_nak THEN 0
        ELSE coalesce(nullif((p_config ->> 'ack_wait')::float8, 0), 30e9) / 1e9 END)
$$;

-- The matching live messages of a stream in (p_after, p_through], at most p_limit.
CREATE FUNCTION jetgres.sqlc_msgs(p_stream bigint, p_after bigint, p_through bigint, p_pattern text, p_limit bigint)
RETURNS TABLE (seq bigint, subject text, hdr bytea, data bytea, ts bigint)
LANGUAGE sql STABLE AS $$
    SELECT m.seq, m.subject, m.hdr, m.data, m.ts
    FROM jetgres.msgs m
    WHERE m.stream_id = p_stream
      AND m.chunk >= coalesce((SELECT max(c.chunk) FROM jetgres.chunks c
                               WHERE c.stream_id = p_stream AND c.first_seq <= p_after + 1), 0)
      AND m.seq > greatest(p_after, (SELECT st.first_seq - 1 FROM jetgres.stream_state st WHERE st.stream_id = p_stream))
      AND m.seq <= p_through
      AND (p_pattern IS NULL OR m.subject ~ p_pattern)
      -- Probed row by row only when the stream has a tombstone in the range at all.
      AND ((SELECT NOT EXISTS (SELECT 1 FROM jetgres.deleted d WHERE d.stream_id = p_stream AND d.seq > p_after))
           OR NOT EXISTS (SELECT 1 FROM jetgres.deleted d WHERE d.stream_id = p_stream AND d.seq = m.seq))
    ORDER BY m.seq
    LIMIT p_limit
$$;

-- Takes the consumer for the calling transaction, once per transaction: its row lock
-- (waiting unless p_wait is false, then o_id is NULL when another transaction holds it),
-- its advisory lock, and the accounting of the attempts that did not commit. The
-- transaction-local setting jetgres.sqlc_<id> says the transaction holds the consumer, and
-- from which sequence on it handed out messages it keeps no row of (o_ranged).
CREATE FUNCTION jetgres.sqlc_enter(p_stream text, p_consumer text, p_wait boolean,
    OUT o_id bigint, OUT o_stream bigint, OUT o_config jsonb, OUT o_pattern text, OUT o_ranged bigint,
    OUT o_attempt bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_held    text;
    v_sc      jetgres.sql_consumers;
    v_floor   bigint;
    v_attempt bigint;
    v_missed  bigint;
    v_reach   bigint;
    v_seq     text;
    v_n       bigint;
    v_timeout text;
    v_locked  boolean;
BEGIN
    SELECT c.id, c.stream_id, c.config INTO o_id, o_stream, o_config
    FROM jetgres.streams s JOIN jetgres.consumers c ON c.stream_id = s.id
    WHERE s.name = p_stream AND c.name = p_consumer;
    IF o_id IS NULL THEN
        RAISE EXCEPTION 'jetgres: stream % has no consumer %', to_json(p_stream), to_json(p_consumer)
            USING ERRCODE = 'JG010';
    END IF;
    -- '<ranged> <attempt> <pattern>': a pattern has no white space, as subjects have none.
    v_held := current_setting('jetgres.sqlc_' || o_id, true);
    IF coalesce(v_held, '') <> '' THEN
        o_ranged := split_part(v_held, ' ', 1)::bigint;
        o_attempt := split_part(v_held, ' ', 2)::bigint;
        o_pattern := nullif(split_part(v_held, ' ', 3), '');
        RETURN;
    END IF;
    IF p_wait THEN
        SELECT * INTO v_sc FROM jetgres.sql_consumers WHERE consumer_id = o_id FOR UPDATE;
    ELSE
        SELECT * INTO v_sc FROM jetgres.sql_consumers WHERE consumer_id = o_id FOR UPDATE SKIP LOCKED;
        IF v_sc.consumer_id IS NULL AND EXISTS (SELECT 1 FROM jetgres.sql_consumers WHERE consumer_id = o_id) THEN
            o_id := NULL;
            RETURN;
        END IF;
    END IF;
    IF v_sc.consumer_id IS NULL THEN
        RAISE EXCEPTION 'jetgres: consumer % of stream % is read over NATS', to_json(p_consumer), to_json(p_stream)
            USING ERRCODE = 'JG011', HINT = 'SELECT jetgres.read_in_sql(stream, consumer) switches it to SQL.';
    END IF;
    -- A transaction that just ended, a killed session's say, may hold the lock for a moment
    -- after its row lock went; a replica holds it for good.
    IF NOT pg_try_advisory_xact_lock((o_id >> 31)::int4, (o_id & 2147483647)::int4) THEN
        v_timeout := current_setting('lock_timeout');
        PERFORM set_config('lock_timeout', '1s', true);
        BEGIN
            PERFORM pg_advisory_xact_lock((o_id >> 31)::int4, (o_id & 2147483647)::int4);
            v_locked := true;
        EXCEPTION WHEN lock_not_available THEN
            v_locked := false;
        END;
        PERFORM set_config('lock_timeout', v_timeout, true);
    END IF;
    IF NOT coalesce(v_locked, true) THEN
        RAISE EXCEPTION 'jetgres: consumer % of stream % is still served over NATS by a jetgres replica', to_json(p_consumer), to_json(p_stream)
            USING ERRCODE = 'JG012', HINT = 'The replica lets it go within seconds of jetgres.read_in_sql; try again.';
    END IF;
    o_pattern := v_sc.pattern;
    -- Read after the row lock, in a statement of its own: the floor the last holder committed.
    SELECT c.ack_stream_seq INTO v_floor FROM jetgres.consumers c WHERE c.id = o_id;
    DELETE FROM jetgres.sql_pending p WHERE p.consumer_id = o_id
        AND p.seq < (SELECT st.first_seq FROM jetgres.stream_state st WHERE st.stream_id = o_stream);
    v_seq := format('jetgres.sqlc_attempt_%s', o_id);
    v_attempt := coalesce(pg_sequence_last_value(v_seq::regclass), 0) + 1;
    PERFORM setval(v_seq::regclass, v_attempt);
    v_missed := v_attempt - v_sc.attempt - 1;
    -- Messages a committed attempt handed out and left unacked get rows, due an ack_wait
    -- after they went out.
    IF v_sc.handed > v_floor THEN
        INSERT INTO jetgres.sql_pending (consumer_id, seq, delivered, due)
        SELECT o_id, m.seq, 1, v_sc.handed_at + jetgres.sqlc_wait(o_config, 1, false)
        FROM jetgres.sqlc_msgs(o_stream, v_floor, v_sc.handed, o_pattern, NULL) m
        ON CONFLICT (consumer_id, seq) DO NOTHING;
    END IF;
    v_seq := format('jetgres.sqlc_reach_%s', o_id);
    IF v_missed > 0 THEN
        v_reach := coalesce(pg_sequence_last_value(v_seq::regclass), 0);
        INSERT INTO jetgres.sql_pending AS p (consumer_id, seq, delivered, due)
        SELECT o_id, m.seq, v_missed, clock_timestamp() + jetgres.sqlc_wait(o_config, v_missed::integer, true)
        FROM jetgres.sqlc_msgs(o_stream, v_floor, v_reach, o_pattern, NULL) m
        ON CONFLICT (consumer_id, seq) DO UPDATE
            SET delivered = p.delivered + v_missed,
                due = clock_timestamp() + jetgres.sqlc_wait(o_config, p.delivered + v_missed::integer, true)
            WHERE NOT p.acked;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        v_sc.handed := greatest(v_sc.handed, v_reach);
        v_sc.deliveries := v_sc.deliveries + v_n * v_missed;
    ELSE
        -- Every earlier attempt is accounted for: the reach starts again from here.
        PERFORM setval(v_seq::regclass, greatest(v_floor, 0));
    END IF;
    UPDATE jetgres.sql_consumers SET attempt = v_attempt, handed = v_sc.handed, deliveries = v_sc.deliveries
    WHERE consumer_id = o_id;
    o_ranged := v_sc.handed;
    o_attempt := v_attempt;
    PERFORM set_config('jetgres.sqlc_' || o_id, o_ranged || ' ' || o_attempt || ' ' || coalesce(o_pattern, ''), true);
END $$;

-- Acks the messages up to p_through that the transaction holding the consumer received
-- (attempt p_attempt) and moves the ack floor up to the lowest message that still waits for
-- its ack: never past one that another attempt handed out and is not due again yet, which
-- this transaction never saw.
CREATE FUNCTION jetgres.sqlc_settle(p_id bigint, p_stream bigint, p_pattern text, p_ranged bigint,
                                    p_attempt bigint, p_through bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_floor  bigint;
    v_handed bigint;
    v_deliv  bigint;
    v_to     bigint;
    v_open   bigint;
    v_above  bigint;
BEGIN
    SELECT c.ack_stream_seq, q.handed, q.deliveries INTO v_floor, v_handed, v_deliv
    FROM jetgres.consumers c JOIN jetgres.sql_consumers q ON q.consumer_id = c.id WHERE c.id = p_id;
    v_to := least(p_through, v_handed);
    -- The common case, everything handed out acked at once, needs no look at the messages.
    IF v_to = v_handed AND NOT EXISTS (SELECT 1 FROM jetgres.sql_pending p WHERE p.consumer_id = p_id) THEN
        IF v_to > v_floor THEN
            UPDATE jetgres.consumers SET ack_stream_seq = v_to, ack_consumer_seq = v_deliv, shown_stream_seq = NULL
            WHERE id = p_id;
            UPDATE jetgres.sql_consumers SET last_acked = clock_timestamp() WHERE consumer_id = p_id;
        END IF;
        RETURN;
    END IF;
    -- The lowest message still waiting for its ack: a row of another attempt, one above
    -- v_to, or one this transaction handed out above v_to that has no row.
    SELECT least(
        (SELECT min(p.seq) FROM jetgres.sql_pending p
         WHERE p.consumer_id = p_id AND NOT p.acked AND (p.seq > v_to OR p.attempt <> p_attempt)),
        (SELECT m.seq FROM jetgres.sqlc_msgs(p_stream, greatest(v_to, p_ranged), v_handed, p_pattern, NULL) m
         WHERE NOT EXISTS (SELECT 1 FROM jetgres.sql_pending p WHERE p.consumer_id = p_id AND p.seq = m.seq)
         LIMIT 1))
    INTO v_open;
    IF v_open <= v_to THEN
        -- Held below: what this transaction acks stays as acked rows until the floor passes.
        UPDATE jetgres.sql_pending p SET acked = true
        WHERE p.consumer_id = p_id AND p.seq <= v_to AND p.attempt = p_attempt AND NOT p.acked;
        INSERT INTO jetgres.sql_pending (consumer_id, seq, delivered, acked, due, attempt)
        SELECT p_id, m.seq, 1, true, clock_timestamp(), p_attempt
        FROM jetgres.sqlc_msgs(p_stream, p_ranged, v_to, p_pattern, NULL) m
        ON CONFLICT ON CONSTRAINT sql_pending_pkey DO NOTHING;
    END IF;
    -- As JetStream's: the floor is just below the lowest message waiting for its ack, or the
    -- last handed out when none waits; whatever lies between is acked or not the consumer's.
    v_to := coalesce(v_open, v_handed + 1) - 1;
    IF v_to <= v_floor THEN
        RETURN;
    END IF;
    DELETE FROM jetgres.sql_pending p WHERE p.consumer_id = p_id AND p.seq <= v_to;
    -- The floor's consumer sequence, as JetStream counts it: every delivery but those of
    -- the messages still above the floor.
    IF v_to < v_handed THEN
        SELECT count(*) INTO v_above FROM jetgres.sqlc_msgs(p_stream, v_to, v_handed, p_pattern, NULL);
    ELSE
        v_above := 0;
    END IF;
    UPDATE jetgres.consumers SET ack_stream_seq = v_to, ack_consumer_seq = greatest(v_deliv - v_above, 0),
        shown_stream_seq = NULL
    WHERE id = p_id;
    UPDATE jetgres.sql_consumers SET last_acked = clock_timestamp() WHERE consumer_id = p_id;
END $$;

CREATE FUNCTION jetgres.next(stream text, consumer text, max integer DEFAULT 100, nowait boolean DEFAULT false)
RETURNS TABLE (seq bigint, subject text, headers jsonb, data bytea, published timestamptz, delivered integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
-- Chunk tables filling under load have no statistics yet: the planner would read every row
-- after the cursor and sort them, where walking the sequence index stops after max rows.
SET search_path = pg_catalog, pg_temp SET enable_bitmapscan = off SET enable_sort = off AS $$
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
            FROM r CROSS JOIN LATERAL (SELECT x.seq, x.subject, x.hdr, x.data, x.ts FROM jetgres.msgs x
                                       WHERE x.stream_id = e.o_stream AND x.seq = r.seq) m
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

CREATE FUNCTION jetgres.ack_through(stream text, consumer text, seq bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    e record;
BEGIN
    e := jetgres.sqlc_enter(ack_through.stream, ack_through.consumer, true);
    PERFORM jetgres.sqlc_settle(e.o_id, e.o_stream, e.o_pattern, e.o_ranged, e.o_attempt, ack_through.seq);
END $$;

CREATE FUNCTION jetgres.ack(stream text, consumer text, seq bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    e        record;
    v_floor  bigint;
    v_handed bigint;
BEGIN
    e := jetgres.sqlc_enter(ack.stream, ack.consumer, true);
    SELECT c.ack_stream_seq, q.handed INTO v_floor, v_handed
    FROM jetgres.consumers c JOIN jetgres.sql_consumers q ON q.consumer_id = c.id WHERE c.id = e.o_id;
    IF ack.seq <= v_floor OR ack.seq > v_handed THEN
        RETURN;
    END IF;
    INSERT INTO jetgres.sql_pending AS p (consumer_id, seq, delivered, acked, due)
    VALUES (e.o_id, ack.seq, 1, true, clock_timestamp())
    ON CONFLICT ON CONSTRAINT sql_pending_pkey DO UPDATE SET acked = true;
    PERFORM jetgres.sqlc_settle(e.o_id, e.o_stream, e.o_pattern, e.o_ranged, e.o_attempt, v_floor);
END $$;

-- Switches a consumer to SQL: replicas stop serving it (the change notifies them) and
-- jetgres.next reads it from its ack floor on. Doing nothing if it is read in SQL already.
CREATE FUNCTION jetgres.read_in_sql(stream text, consumer text)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_id     bigint;
    v_stream bigint;
    v_floor  bigint;
BEGIN
    SELECT c.id, c.stream_id, c.ack_stream_seq INTO v_id, v_stream, v_floor
    FROM jetgres.streams s JOIN jetgres.consumers c ON c.stream_id = s.id
    WHERE s.name = read_in_sql.stream AND c.name = read_in_sql.consumer
    FOR UPDATE OF c;
    IF v_id IS NULL THEN
        RAISE EXCEPTION 'jetgres: stream % has no consumer %', to_json(read_in_sql.stream), to_json(read_in_sql.consumer)
            USING ERRCODE = 'JG010';
    END IF;
    IF EXISTS (SELECT 1 FROM jetgres.sql_consumers q WHERE q.consumer_id = v_id) THEN
        RETURN;
    END IF;
    EXECUTE format('CREATE SEQUENCE IF NOT EXISTS jetgres.%I MINVALUE 0 START 0', 'sqlc_attempt_' || v_id);
    EXECUTE format('CREATE SEQUENCE IF NOT EXISTS jetgres.%I MINVALUE 0 START 0', 'sqlc_reach_' || v_id);
    INSERT INTO jetgres.sql_consumers (consumer_id, handed, deliveries, pattern)
    SELECT v_id, v_floor, c.ack_consumer_seq, jetgres.sqlc_pattern(c.config) FROM jetgres.consumers c WHERE c.id = v_id;
    UPDATE jetgres.consumers SET owner = '' WHERE id = v_id;
    PERFORM pg_notify('jetgres_meta', v_stream::text);
END $$;

-- Gives a consumer back to NATS: whatever is handed out and not acked is redelivered from
-- the ack floor. It waits for the transaction that holds the consumer, if any.
CREATE FUNCTION jetgres.read_over_nats(stream text, consumer text)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_id     bigint;
    v_stream bigint;
BEGIN
    SELECT c.id, c.stream_id INTO v_id, v_stream
    FROM jetgres.streams s JOIN jetgres.consumers c ON c.stream_id = s.id
    WHERE s.name = read_over_nats.stream AND c.name = read_over_nats.consumer;
    IF v_id IS NULL THEN
        RAISE EXCEPTION 'jetgres: stream % has no consumer %', to_json(read_over_nats.stream), to_json(read_over_nats.consumer)
            USING ERRCODE = 'JG010';
    END IF;
    PERFORM 1 FROM jetgres.sql_consumers q WHERE q.consumer_id = v_id FOR UPDATE;
    DELETE FROM jetgres.sql_consumers q WHERE q.consumer_id = v_id;
    PERFORM pg_notify('jetgres_meta', v_stream::text);
END $$;

REVOKE ALL ON FUNCTION jetgres.next(text, text, integer, boolean), jetgres.ack(text, text, bigint),
    jetgres.ack_through(text, text, bigint), jetgres.read_in_sql(text, text),
    jetgres.read_over_nats(text, text), jetgres.sqlc_dropped(), jetgres.sqlc_pattern(jsonb),
    jetgres.sqlc_wait(jsonb, integer, boolean), jetgres.sqlc_msgs(bigint, bigint, bigint, text, bigint),
    jetgres.sqlc_enter(text, text, boolean), jetgres.sqlc_settle(bigint, bigint, text, bigint, bigint, bigint)
    FROM PUBLIC;

-- As jetgres.grant_sql_roles, for jetgres_consumer: created when the migrating role may,
-- else by an administrator (CREATE ROLE jetgres_consumer NOLOGIN), who then runs
-- SELECT jetgres.grant_consumer_role().
CREATE FUNCTION jetgres.grant_consumer_role()
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'jetgres_consumer') THEN
        GRANT USAGE ON SCHEMA jetgres TO jetgres_consumer;
        GRANT EXECUTE ON FUNCTION jetgres.next(text, text, integer, boolean), jetgres.ack(text, text, bigint),
            jetgres.ack_through(text, text, bigint), jetgres.read_in_sql(text, text),
            jetgres.read_over_nats(text, text) TO jetgres_consumer;
    END IF;
END $$;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'jetgres_consumer') THEN
        IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = current_user AND (rolsuper OR rolcreaterole)) THEN
            BEGIN
                CREATE ROLE jetgres_consumer NOLOGIN;
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL; -- another database's migration created it at the same moment
            END;
        ELSE
            RAISE WARNING 'jetgres: role jetgres_consumer does not exist and % may not create it; see jetgres.grant_consumer_role()', current_user;
        END IF;
    END IF;
    PERFORM jetgres.grant_consumer_role();
END $$;
