-- The last live message of each of p_subjects in a stream, with its header and data: what a
-- derived message (a counter's increment, pg.AppendMsg.Derive) is made from. One call in the
-- append transaction's first round trip, after the statement that locks the stream's row,
-- so it reads what the last transaction to hold that lock committed. A subject without a
-- live message has no row. Chunks are probed newest first, each by its (subject, seq) index,
-- and the probe of a subject stops at its first chunk that holds one.
CREATE FUNCTION jetgres.subject_last(p_stream bigint, p_subjects text[])
RETURNS TABLE (subject text, seq bigint, hdr bytea, data bytea)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_from bigint;
    v_tabs text[];
    v_tab  text;
    v_subj text;
    v_got  bigint;
BEGIN
    SELECT st.first_seq INTO v_from FROM jetgres.stream_state st WHERE st.stream_id = p_stream;
    SELECT array_agg(l.chunk_table ORDER BY l.first_seq DESC) INTO v_tabs
    FROM jetgres.live_chunks(p_stream, v_from) l;
    FOREACH v_subj IN ARRAY p_subjects LOOP
        FOREACH v_tab IN ARRAY coalesce(v_tabs, '{}') LOOP
            RETURN QUERY EXECUTE format(
                'SELECT m.subject, m.seq, m.hdr, m.data
                 FROM jetgres.%I m
                 WHERE m.subject = $1 AND m.seq >= $2
                   AND NOT EXISTS (SELECT 1 FROM jetgres.deleted d WHERE d.stream_id = $3 AND d.seq = m.seq)
                 ORDER BY m.seq DESC LIMIT 1', v_tab)
                USING v_subj, v_from, p_stream;
            GET DIAGNOSTICS v_got = ROW_COUNT;
            EXIT WHEN v_got > 0;
        END LOOP;
    END LOOP;
END $$;
