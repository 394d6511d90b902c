-- Nats-Msg-Id de-duplication ids, stored the way messages are: in tables that are only
-- inserted into and dropped whole, never pruned row by row.
--
-- One stream's ids go to bucket tables jetgres.ids_<stream id>_<bucket number>, listed in
-- jetgres.id_buckets. The newest bucket receives every new id until an id arrives a whole
-- duplicate window after the bucket's first: that id opens the next bucket. So every id of
-- a bucket was stamped before the next bucket's first_ts, and a bucket whose successor began
-- before the window's start can hold no id that still matches: it is dropped whole. A
-- lookup reads only the buckets that can still match: the newest and, at most, the one
-- before it while the window is unchanged.
--
-- A bucket belongs to one stream, so its key is the id alone: a lookup is an equality on
-- the primary key whatever the statistics say (the old table's key began with stream_id,
-- and a planner that had not yet analyzed it read every id of the stream and filtered).
CREATE TABLE jetgres.id_buckets (
    stream_id  bigint NOT NULL REFERENCES jetgres.streams (id) ON DELETE CASCADE,
    bucket     bigint NOT NULL,
    first_ts   bigint NOT NULL,  -- unix nanoseconds of the id that opened the bucket
    PRIMARY KEY (stream_id, bucket)
);

CREATE FUNCTION jetgres.id_bucket_table(p_stream bigint, p_bucket bigint)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT format('jetgres.%I', 'ids_' || p_stream || '_' || p_bucket)
$$;

CREATE FUNCTION jetgres.create_id_bucket(p_stream bigint, p_bucket bigint, p_first_ts bigint)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_tab text := jetgres.id_bucket_table(p_stream, p_bucket);
BEGIN
    EXECUTE format('CREATE TABLE %s (
        msg_id text   COLLATE "C" PRIMARY KEY,
        seq    bigint NOT NULL,
        ts     bigint NOT NULL
    )', v_tab);
    INSERT INTO jetgres.id_buckets (stream_id, bucket, first_ts) VALUES (p_stream, p_bucket, p_first_ts);
    RETURN v_tab;
END
$$;

-- msg_ids_seen returns those of p_ids recorded after p_cutoff, with their sequences, oldest
-- bucket first (a later row for the same id is the one that counts). It runs after the
-- append has locked the stream's state row: every bucket it lists was committed by a
-- transaction that held that lock, and none can be dropped before this one ends.
--
-- Each bucket is read through its key, whatever the planner believes of it: with many ids
-- to look up and a bucket it has not analyzed yet, it would otherwise pick a scan of the
-- whole bucket, the plan that stalled publishes until autoanalyze came by. The setting
-- holds only while the function runs.
CREATE FUNCTION jetgres.msg_ids_seen(p_stream bigint, p_ids text[], p_cutoff bigint)
RETURNS TABLE (msg_id text, seq bigint)
LANGUAGE plpgsql STABLE
SET enable_seqscan = off AS $$
DECLARE
    v_bucket bigint;
BEGIN
    FOR v_bucket IN
        SELECT k.bucket FROM (
            SELECT b.bucket, lead(b.first_ts) OVER (ORDER BY b.bucket) AS next_ts
            FROM jetgres.id_buckets b WHERE b.stream_id = p_stream) k
        WHERE k.next_ts IS NULL OR k.next_ts > p_cutoff
        ORDER BY k.bucket
    LOOP
        RETURN QUERY EXECUTE format('SELECT msg_id, seq FROM %s WHERE msg_id = ANY($1) AND ts > $2',
            jetgres.id_bucket_table(p_stream, v_bucket)) USING p_ids, p_cutoff;
    END LOOP;
END
$$;

-- msg_ids_put records ids stored at p_ts in the stream's newest bucket, opening a new one
-- once p_ts is a whole window (p_width nanoseconds) past the newest bucket's first id. An id
-- already in that bucket is outside the window (the append found no match for it), so its
-- row takes the new sequence; with a constant window that cannot happen, as the old id would
-- be in an older bucket.
CREATE FUNCTION jetgres.msg_ids_put(p_stream bigint, p_ids text[], p_seqs bigint[], p_ts bigint, p_width bigint)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_bucket bigint;
    v_first  bigint;
    v_tab    text;
BEGIN
    SELECT b.bucket, b.first_ts INTO v_bucket, v_first
    FROM jetgres.id_buckets b WHERE b.stream_id = p_stream ORDER BY b.bucket DESC LIMIT 1;
    -- Subtracting keeps a window near the top of bigint (JetStream allows any) from overflowing.
    IF v_bucket IS NULL OR p_ts - v_first >= p_width THEN
        v_tab := jetgres.create_id_bucket(p_stream, coalesce(v_bucket, 0) + 1, p_ts);
    ELSE
        v_tab := jetgres.id_bucket_table(p_stream, v_bucket);
    END IF;
    EXECUTE format('INSERT INTO %s (msg_id, seq, ts) SELECT u.id, u.seq, $3 FROM unnest($1::text[], $2::bigint[]) AS u(id, seq)
        ON CONFLICT (msg_id) DO UPDATE SET seq = excluded.seq, ts = excluded.ts', v_tab) USING p_ids, p_seqs, p_ts;
END
$$;

-- The ids still inside their stream's window move to each stream's first bucket, opened at
-- the oldest of them, which is less than a window old: every moved id was stamped before
-- the next bucket can open. Ids past their window cannot match any more and are left
-- behind with the old table, which goes at once rather than aging out beside the buckets:
-- reading both would keep the plan this migration removes on the hot path for a window.
DO $$
DECLARE
    r record;
    v_now bigint := (extract(epoch FROM clock_timestamp()) * 1e9)::bigint;
BEGIN
    FOR r IN
        SELECT m.stream_id, min(m.ts) AS first_ts
        FROM jetgres.msg_ids m JOIN jetgres.streams s ON s.id = m.stream_id
        WHERE m.ts > v_now - coalesce((s.config ->> 'duplicate_window')::bigint, 0)
        GROUP BY m.stream_id
    LOOP
        EXECUTE format('INSERT INTO %s (msg_id, seq, ts) SELECT m.msg_id, m.seq, m.ts FROM jetgres.msg_ids m
            WHERE m.stream_id = $1 AND m.ts >= $2', jetgres.create_id_bucket(r.stream_id, 1, r.first_ts))
            USING r.stream_id, r.first_ts;
    END LOOP;
END
$$;

DROP TABLE jetgres.msg_ids;
