-- Stream limits and retention.
--
-- msgs and bytes count what a stream holds between first_seq and last_seq. Every statement
-- that changes that (append, eviction, purge, tombstone, retention) keeps them right under
-- the state row's lock, so that the limits checked on every append and the numbers stream
-- info reports cost one row read instead of a count over tombstones. num_deleted follows:
-- (last_seq - first_seq + 1) - msgs.
--
-- first_seq always names a live message, or is last_seq + 1 when the stream is empty.
-- jetgres.deleted holds, for every sequence in between that holds nothing, either a
-- tombstone (size > 0: the row is still in its chunk table) or a gap marker (size 0: the
-- sequence was taken by a publish that no consumer was interested in and has no row), so
-- that moving first_seq past a range counts what it removes from tombstones alone.
ALTER TABLE jetgres.stream_state
    ADD COLUMN msgs  bigint NOT NULL DEFAULT 0,
    ADD COLUMN bytes bigint NOT NULL DEFAULT 0;

DO $$
DECLARE
    s          record;
    first_cum  bigint;
    gone       bigint;
    gone_bytes bigint;
BEGIN
    FOR s IN
        SELECT st.stream_id, st.first_seq, st.last_seq, st.cum_bytes,
               (SELECT c.chunk FROM jetgres.chunks c
                WHERE c.stream_id = st.stream_id AND c.first_seq <= st.first_seq
                ORDER BY c.chunk DESC LIMIT 1) AS chunk
        FROM jetgres.stream_state st
        WHERE st.first_seq <= st.last_seq
    LOOP
        EXECUTE format('SELECT cum_before FROM jetgres.%I WHERE seq = $1', format('msgs_%s_%s', s.stream_id, s.chunk))
            INTO first_cum USING s.first_seq;
        SELECT count(*), coalesce(sum(d.size), 0) INTO gone, gone_bytes
        FROM jetgres.deleted d
        WHERE d.stream_id = s.stream_id AND d.seq BETWEEN s.first_seq AND s.last_seq;
        UPDATE jetgres.stream_state
        SET msgs = s.last_seq - s.first_seq + 1 - gone,
            bytes = s.cum_bytes - coalesce(first_cum, s.cum_bytes) - gone_bytes
        WHERE stream_id = s.stream_id;
    END LOOP;
END $$;

-- The chunk tables that can hold sequences at or after from_seq, oldest first. A chunk wholly
-- below the stream's first sequence is never listed, so a caller that holds the state row's
-- lock never reads a table the maintainer may be dropping.
CREATE FUNCTION jetgres.live_chunks(p_stream bigint, p_from bigint)
RETURNS TABLE (chunk_table text, first_seq bigint)
LANGUAGE sql STABLE AS $$
    SELECT format('msgs_%s_%s', p_stream, k.chunk), k.first_seq
    FROM (SELECT c.chunk, c.first_seq, lead(c.first_seq) OVER (ORDER BY c.chunk) AS next_first
          FROM jetgres.chunks c WHERE c.stream_id = p_stream) k
    WHERE k.next_first IS NULL OR k.next_first > p_from
    ORDER BY k.chunk
$$;

-- The oldest live messages of a stream from from_seq on (from its first sequence when
-- from_seq is null), at most p_limit of them, with their stored sizes (pg.MessageSize, the
-- size of JetStream's file store record): what discard-old
-- limits evict. One call in the append transaction's first round trip, where the chunk that
-- holds the first sequence is not yet known to the caller.
CREATE FUNCTION jetgres.stream_head(p_stream bigint, p_from bigint, p_limit integer)
RETURNS TABLE (seq bigint, size bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_from bigint;
    v_left integer := p_limit;
    v_got  integer;
    v_tab  text;
BEGIN
    SELECT greatest(st.first_seq, coalesce(p_from, 0)) INTO v_from
    FROM jetgres.stream_state st WHERE st.stream_id = p_stream;
    FOR v_tab IN SELECT l.chunk_table FROM jetgres.live_chunks(p_stream, v_from) l LOOP
        EXIT WHEN v_left <= 0;
        RETURN QUERY EXECUTE format(
            'SELECT m.seq, (30 + octet_length(m.subject) + octet_length(m.data) + CASE WHEN coalesce(octet_length(m.hdr), 0) = 0 THEN 0 ELSE 4 + octet_length(m.hdr) END)::bigint
             FROM jetgres.%I m
             WHERE m.seq >= $1
               AND NOT EXISTS (SELECT 1 FROM jetgres.deleted d WHERE d.stream_id = $2 AND d.seq = m.seq)
             ORDER BY m.seq LIMIT $3', v_tab)
            USING v_from, p_stream, v_left;
        GET DIAGNOSTICS v_got = ROW_COUNT;
        v_left := v_left - v_got;
    END LOOP;
END $$;

-- Every live message of the given subjects, oldest first, with its stored size: what
-- max_msgs_per_subject counts and evicts.
CREATE FUNCTION jetgres.subject_live(p_stream bigint, p_subjects text[])
RETURNS TABLE (subject text, seq bigint, size bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_from bigint;
    v_tab  text;
BEGIN
    SELECT st.first_seq INTO v_from FROM jetgres.stream_state st WHERE st.stream_id = p_stream;
    FOR v_tab IN SELECT l.chunk_table FROM jetgres.live_chunks(p_stream, v_from) l LOOP
        RETURN QUERY EXECUTE format(
            'SELECT m.subject, m.seq, (30 + octet_length(m.subject) + octet_length(m.data) + CASE WHEN coalesce(octet_length(m.hdr), 0) = 0 THEN 0 ELSE 4 + octet_length(m.hdr) END)::bigint
             FROM jetgres.%I m
             WHERE m.subject = ANY($1) AND m.seq >= $2
               AND NOT EXISTS (SELECT 1 FROM jetgres.deleted d WHERE d.stream_id = $3 AND d.seq = m.seq)
             ORDER BY m.seq', v_tab)
            USING p_subjects, v_from, p_stream;
    END LOOP;
END $$;
