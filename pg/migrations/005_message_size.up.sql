-- A message's stored size, defined once in SQL as pg.MessageSize defines it in Go: the size
-- of its record in JetStream's file store, so that bytes and max_bytes mean the same here as
-- there. Until now each statement that needed it spelled the expression out.
--
-- A LANGUAGE sql function whose body is one expression, not STRICT, is inlined into the
-- statements that call it when they are planned: calling it costs what writing the
-- expression out did.
CREATE FUNCTION jetgres.message_size(p_subject text, p_hdr bytea, p_data bytea)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (30 + octet_length(p_subject) + octet_length(p_data)
        + CASE WHEN coalesce(octet_length(p_hdr), 0) = 0 THEN 0 ELSE 4 + octet_length(p_hdr) END)::bigint
$$;

-- subject_live and stream_head as 004 left them, with their sizes from message_size.
CREATE OR REPLACE FUNCTION jetgres.subject_live(p_stream bigint, p_subjects text[], p_limit bigint)
RETURNS TABLE (subject text, seq bigint, size bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_from bigint;
    v_tabs text[];
    v_tab  text;
    v_subj text;
    v_left bigint;
    v_got  bigint;
BEGIN
    SELECT st.first_seq INTO v_from FROM jetgres.stream_state st WHERE st.stream_id = p_stream;
    SELECT array_agg(l.chunk_table ORDER BY l.first_seq DESC) INTO v_tabs
    FROM jetgres.live_chunks(p_stream, v_from) l;
    FOREACH v_subj IN ARRAY p_subjects LOOP
        v_left := p_limit;
        FOREACH v_tab IN ARRAY coalesce(v_tabs, '{}') LOOP
            EXIT WHEN v_left <= 0;
            RETURN QUERY EXECUTE format(
                'SELECT m.subject, m.seq, jetgres.message_size(m.subject, m.hdr, m.data)
                 FROM jetgres.%I m
                 WHERE m.subject = $1 AND m.seq >= $2
                   AND (SELECT NOT EXISTS (SELECT 1 FROM jetgres.deleted d WHERE d.stream_id = $3 AND d.seq = m.seq))
                 ORDER BY m.seq DESC LIMIT $4', v_tab)
                USING v_subj, v_from, p_stream, v_left;
            GET DIAGNOSTICS v_got = ROW_COUNT;
            v_left := v_left - v_got;
        END LOOP;
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION jetgres.stream_head(p_stream bigint, p_from bigint, p_limit integer)
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
            'SELECT m.seq, jetgres.message_size(m.subject, m.hdr, m.data)
             FROM jetgres.%I m
             WHERE m.seq >= $1
               AND (SELECT NOT EXISTS (SELECT 1 FROM jetgres.deleted d WHERE d.stream_id = $2 AND d.seq = m.seq))
             ORDER BY m.seq LIMIT $3', v_tab)
            USING v_from, p_stream, v_left;
        GET DIAGNOSTICS v_got = ROW_COUNT;
        v_left := v_left - v_got;
    END LOOP;
END $$;
