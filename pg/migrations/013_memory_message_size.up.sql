-- nats-server counts a message of a memory stream as its subject, headers and payload and 16
-- bytes (a sequence and a time), where its file store counts 30 (34 with headers): a memory
-- stream's bytes, its max_bytes and the account's memory usage differed from nats-server's by
-- 14-18 bytes a message. A stream's state row now says which it counts. Streams created
-- before keep the file store's sizes, which their stored cumulative sizes were made with.
ALTER TABLE jetgres.stream_state ADD COLUMN memory boolean NOT NULL DEFAULT false;

CREATE FUNCTION jetgres.message_size(p_subject text, p_hdr bytea, p_data bytea, p_memory boolean)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_memory
        THEN (16 + octet_length(p_subject) + octet_length(p_data) + coalesce(octet_length(p_hdr), 0))::bigint
        ELSE jetgres.message_size(p_subject, p_hdr, p_data) END
$$;

-- subject_live and stream_head as 005 left them, sized as their stream counts.
CREATE OR REPLACE FUNCTION jetgres.subject_live(p_stream bigint, p_subjects text[], p_limit bigint)
RETURNS TABLE (subject text, seq bigint, size bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_from   bigint;
    v_memory boolean;
    v_tabs   text[];
    v_tab    text;
    v_subj   text;
    v_left   bigint;
    v_got    bigint;
BEGIN
    SELECT st.first_seq, st.memory INTO v_from, v_memory FROM jetgres.stream_state st WHERE st.stream_id = p_stream;
    SELECT array_agg(l.chunk_table ORDER BY l.first_seq DESC) INTO v_tabs
    FROM jetgres.live_chunks(p_stream, v_from) l;
    FOREACH v_subj IN ARRAY p_subjects LOOP
        v_left := p_limit;
        FOREACH v_tab IN ARRAY coalesce(v_tabs, '{}') LOOP
            EXIT WHEN v_left <= 0;
            RETURN QUERY EXECUTE format(
                'SELECT m.subject, m.seq, jetgres.message_size(m.subject, m.hdr, m.data, $5)
                 FROM jetgres.%I m
                 WHERE m.subject = $1 AND m.seq >= $2
                   AND (SELECT NOT EXISTS (SELECT 1 FROM jetgres.deleted d WHERE d.stream_id = $3 AND d.seq = m.seq))
                 ORDER BY m.seq DESC LIMIT $4', v_tab)
                USING v_subj, v_from, p_stream, v_left, v_memory;
            GET DIAGNOSTICS v_got = ROW_COUNT;
            v_left := v_left - v_got;
        END LOOP;
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION jetgres.stream_head(p_stream bigint, p_from bigint, p_limit integer)
RETURNS TABLE (seq bigint, size bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_from   bigint;
    v_memory boolean;
    v_left   integer := p_limit;
    v_got    integer;
    v_tab    text;
BEGIN
    SELECT greatest(st.first_seq, coalesce(p_from, 0)), st.memory INTO v_from, v_memory
    FROM jetgres.stream_state st WHERE st.stream_id = p_stream;
    FOR v_tab IN SELECT l.chunk_table FROM jetgres.live_chunks(p_stream, v_from) l LOOP
        EXIT WHEN v_left <= 0;
        RETURN QUERY EXECUTE format(
            'SELECT m.seq, jetgres.message_size(m.subject, m.hdr, m.data, $4)
             FROM jetgres.%I m
             WHERE m.seq >= $1
               AND (SELECT NOT EXISTS (SELECT 1 FROM jetgres.deleted d WHERE d.stream_id = $2 AND d.seq = m.seq))
             ORDER BY m.seq LIMIT $3', v_tab)
            USING v_from, p_stream, v_left, v_memory;
        GET DIAGNOSTICS v_got = ROW_COUNT;
        v_left := v_left - v_got;
    END LOOP;
END $$;
