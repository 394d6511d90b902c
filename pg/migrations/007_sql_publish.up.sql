-- Publishing from the application's own transaction, and reading streams with SQL.
--
-- jetgres.publish only inserts into a staging table and never touches a stream's state row,
-- so a long application transaction and the NATS publishers never wait on each other. A
-- mover in jetgres (pg.MoveStaged) appends committed staged rows to their streams through
-- the same append path as NATS publishes, in snapshot-bounded batches: only rows whose
-- transactions ended before every transaction still running, taken in (xid, call) order,
-- so that a transaction that commits late with a low xid is never skipped. Its progress is
-- the (xid, call) of the last row it moved, updated in the append's own transaction under
-- the lock of jetgres.staging's single row: exactly once across a crash and across replicas.
--
-- Two staging tables take turns (jetgres.staging_target). Once the mover switched the
-- target and everything in the other table is moved, it takes that table's lock without
-- waiting (NOWAIT: a transaction that still inserts there makes it try again later) and
-- truncates it: the space of moved and rolled-back rows goes back without VACUUM and with no
-- dead tuple left.
--
-- Errors raised at the call (SQLSTATE, class JG):
--   JG001  invalid subject (empty token, white space, a wildcard, longer than 2048 bytes)
--   JG002  no stream takes the subject
--   JG003  the message is larger than the stream's max_msg_size
--   JG004  headers are not an object of strings or arrays of strings, or a name or a value
--          cannot be a NATS header
-- Everything else a stream decides is decided at the move, as for a NATS publish.

-- A subject filter as an anchored regular expression, the rule of pg.SubjectMatches
-- (nats-server's): '*' matches one token, '>' one or more; other characters match themselves.
CREATE FUNCTION jetgres.subject_regexp(p_filter text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT '^' || string_agg(CASE x.t WHEN '*' THEN '[^.]+' WHEN '>' THEN '.+'
                             ELSE regexp_replace(x.t, '([^[:alnum:]_])', '\\\1', 'g') END,
                             '\.' ORDER BY x.n) || '$'
    FROM unnest(string_to_array(p_filter, '.')) WITH ORDINALITY AS x(t, n)
$$;

-- A subject a NATS client may publish to and PostgreSQL may index (checkStorable's bound).
CREATE FUNCTION jetgres.valid_publish_subject(p_subject text)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    -- One regular expression, a token being one character that is not a wildcard or two
    -- and more of anything but dots and white space: splitting the subject into an array
    -- to look for wildcard tokens cost a call as much as the rest of its checks.
    SELECT p_subject IS NOT NULL
       AND octet_length(p_subject) <= 2048
       AND p_subject ~ '^(?:[^.[:space:]*>]|[^.[:space:]]{2,})(?:\.(?:[^.[:space:]*>]|[^.[:space:]]{2,}))*$'
$$;

-- A stream's subjects as JetStream defaults them: its name when it has none of its own and
-- is neither a mirror nor sourced.
CREATE FUNCTION jetgres.stream_subjects(p_name text, p_config jsonb)
RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN jsonb_array_length(coalesce(p_config -> 'subjects', '[]')) > 0
            THEN ARRAY(SELECT jsonb_array_elements_text(p_config -> 'subjects'))
        WHEN p_config -> 'mirror' IS NULL AND p_config -> 'sources' IS NULL THEN ARRAY[p_name]
        ELSE '{}'::text[]
    END
$$;

-- Which stream takes a subject, kept beside jetgres.streams by a trigger so that a publish
-- looks it up through an index on the filter's first token instead of reading every
-- stream's configuration. A route's own rows change only with stream create, update and
-- delete.
CREATE TABLE jetgres.stream_routes (
    stream_id bigint NOT NULL REFERENCES jetgres.streams (id) ON DELETE CASCADE,
    filter    text   NOT NULL,
    head      text   NOT NULL, -- the filter's first token
    pattern   text   NOT NULL, -- jetgres.subject_regexp(filter)
    max_size  bigint           -- max_msg_size, NULL for none
);
CREATE INDEX stream_routes_head ON jetgres.stream_routes (head);

CREATE FUNCTION jetgres.stream_routes_sync()
RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        DELETE FROM jetgres.stream_routes WHERE stream_id = OLD.id;
    END IF;
    INSERT INTO jetgres.stream_routes (stream_id, filter, head, pattern, max_size)
    SELECT NEW.id, f, split_part(f, '.', 1), jetgres.subject_regexp(f),
           nullif(greatest((NEW.config ->> 'max_msg_size')::bigint, 0), 0)
    FROM unnest(jetgres.stream_subjects(NEW.name, NEW.config)) f;
    RETURN NULL;
END $$;

CREATE TRIGGER streams_routes AFTER INSERT OR UPDATE OF name, config ON jetgres.streams
    FOR EACH ROW EXECUTE FUNCTION jetgres.stream_routes_sync();

INSERT INTO jetgres.stream_routes (stream_id, filter, head, pattern, max_size)
SELECT s.id, f, split_part(f, '.', 1), jetgres.subject_regexp(f),
       nullif(greatest((s.config ->> 'max_msg_size')::bigint, 0), 0)
FROM jetgres.streams s, unnest(jetgres.stream_subjects(s.name, s.config)) f;

-- NATS header bytes from {"Name": "v"} or {"Name": ["v1", "v2"]}.
CREATE FUNCTION jetgres.headers_bytes(p_headers jsonb)
RETURNS bytea
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_out  text := '';
    v_name text;
    v_vals jsonb;
    v_val  jsonb;
BEGIN
    IF p_headers IS NULL OR p_headers = '{}'::jsonb THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(p_headers) <> 'object' THEN
        RAISE EXCEPTION 'jetgres.publish: headers must be a JSON object, not %', jsonb_typeof(p_headers)
            USING ERRCODE = 'JG004';
    END IF;
    FOR v_name, v_vals IN SELECT key, value FROM jsonb_each(p_headers) LOOP
        IF v_name !~ '^[!-9;-~]+$' THEN
            RAISE EXCEPTION 'jetgres.publish: header name % is not a NATS header name', to_json(v_name)
                USING ERRCODE = 'JG004';
        END IF;
        IF jsonb_typeof(v_vals) = 'string' THEN
            v_vals := jsonb_build_array(v_vals);
        END IF;
        IF jsonb_typeof(v_vals) <> 'array' THEN
            RAISE EXCEPTION 'jetgres.publish: header % must be a string or an array of strings', to_json(v_name)
                USING ERRCODE = 'JG004';
        END IF;
        FOR v_val IN SELECT value FROM jsonb_array_elements(v_vals) LOOP
            IF jsonb_typeof(v_val) <> 'string' OR (v_val #>> '{}') ~ '[\r\n]' THEN
                RAISE EXCEPTION 'jetgres.publish: header % has a value that is not a one-line string', to_json(v_name)
                    USING ERRCODE = 'JG004';
            END IF;
            v_out := v_out || v_name || ': ' || (v_val #>> '{}') || E'\r\n';
        END LOOP;
    END LOOP;
    IF v_out = '' THEN
        RETURN NULL;
    END IF;
    RETURN convert_to(E'NATS/1.0\r\n' || v_out || E'\r\n', 'UTF8');
END $$;

-- NATS header bytes as {"Name": ["v1", "v2"]}; the status line is left out.
CREATE FUNCTION jetgres.headers_jsonb(p_hdr bytea)
RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT jsonb_object_agg(h.name, h.vals)
    FROM (SELECT l.name, jsonb_agg(l.val ORDER BY l.n) AS vals
          FROM (SELECT t.n, btrim(split_part(t.line, ':', 1)) AS name,
                       ltrim(substr(t.line, strpos(t.line, ':') + 1)) AS val
                FROM unnest(string_to_array(convert_from(p_hdr, 'UTF8'), E'\r\n')) WITH ORDINALITY AS t(line, n)
                WHERE t.n > 1 AND strpos(t.line, ':') > 1) l
          GROUP BY l.name) h
$$;

-- The mover's progress, updated by every move under this row's lock.
CREATE TABLE jetgres.staging (
    one        boolean     PRIMARY KEY DEFAULT true CHECK (one),
    moved_xid  xid8        NOT NULL DEFAULT '0',  -- the last row moved: its transaction
    moved_call bigint      NOT NULL DEFAULT 0     -- and its call
) WITH (fillfactor = 50);
INSERT INTO jetgres.staging DEFAULT VALUES;

-- The table calls insert into, apart from the progress: every call reads it, and a row
-- updated by every move would leave its readers walking the versions that a long
-- transaction keeps from being pruned. This one changes once per rotation.
CREATE TABLE jetgres.staging_target (
    one      boolean     PRIMARY KEY DEFAULT true CHECK (one),
    target   smallint    NOT NULL DEFAULT 0 CHECK (target IN (0, 1)),
    switched timestamptz NOT NULL DEFAULT now() -- when target last changed
);
INSERT INTO jetgres.staging_target DEFAULT VALUES;

-- Call order within a transaction: one session's calls take increasing numbers, whatever
-- other sessions take from their own cached ranges.
CREATE SEQUENCE jetgres.staged_call CACHE 64;

CREATE TABLE jetgres.staged_0 (
    xid       xid8   NOT NULL DEFAULT pg_current_xact_id(),
    call      bigint NOT NULL,
    stream_id bigint NOT NULL,
    subject   text   NOT NULL,
    hdr       bytea,
    data      bytea  NOT NULL
);
CREATE INDEX staged_0_order ON jetgres.staged_0 (xid, call);
CREATE TABLE jetgres.staged_1 (LIKE jetgres.staged_0 INCLUDING ALL);

-- A commit that published wakes the mover with NOTIFY only while no mover is awake: every
-- transaction that queued a notification takes one global lock at commit and holds it
-- through its WAL flush, so notifying commits cannot share a flush. An awake mover holds
-- this session-level advisory lock ('jetgres' and 3 in ASCII) and moves on its own; a call
-- that can take it shared for a moment knows none is awake and notifies. The call looks
-- after its insert, once the transaction has its id, so that a mover which lets the lock
-- go and then waits for every transaction older than that moment to end (pg.StagedSettled)
-- sees each commit that did not notify.
-- A transaction that publishes many messages pays for the route lookup and the lock look
-- once: the call keeps the route in a transaction-local setting (set_config(…, true)),
-- gone at commit or rollback, and its first call, the one that finds the setting empty,
-- is the one that looks. jetgres.publish_route is '<target> <stream id> <max_msg_size>
-- <pattern>' of the last route found; a later subject that the pattern matches takes that
-- stream (streams' subjects never overlap). One setting, not one for the route and one for
-- the look: each set_config is a good part of what a one-message transaction's call costs.
-- A session can set it itself; what that gets it past the call, the move refuses, as it
-- refuses a message whose stream changed since the call.
CREATE FUNCTION jetgres.publish(subject text, data bytea, headers jsonb DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_route   text := current_setting('jetgres.publish_route', true);
    v_first   boolean := coalesce(v_route, '') = '';
    v_stream  bigint;
    v_max     bigint;
    v_target  smallint;
    v_pattern text;
    v_hdr     bytea;
    v_data    bytea := coalesce(data, ''::bytea);
BEGIN
    IF NOT jetgres.valid_publish_subject(subject) THEN
        RAISE EXCEPTION 'jetgres.publish: invalid subject %', coalesce(to_json(subject)::text, 'null')
            USING ERRCODE = 'JG001';
    END IF;
    IF NOT v_first AND subject ~ split_part(v_route, ' ', 4) THEN
        v_target := split_part(v_route, ' ', 1)::smallint;
        v_stream := split_part(v_route, ' ', 2)::bigint;
        v_max := nullif(split_part(v_route, ' ', 3), '')::bigint;
    ELSE
        -- One statement for the route and the staging target, and a plain one: a lateral
        -- join with ORDER BY … LIMIT cost a call three times the insert.
        SELECT r.stream_id, r.max_size, r.pattern, (SELECT t.target FROM jetgres.staging_target t)
        INTO v_stream, v_max, v_pattern, v_target
        FROM jetgres.stream_routes r
        WHERE r.head IN (split_part(publish.subject, '.', 1), '*', '>') AND publish.subject ~ r.pattern;
        IF v_stream IS NULL THEN
            RAISE EXCEPTION 'jetgres.publish: no stream takes subject %', to_json(subject)
                USING ERRCODE = 'JG002';
        END IF;
        PERFORM set_config('jetgres.publish_route',
            v_target || ' ' || v_stream || ' ' || coalesce(v_max::text, '') || ' ' || v_pattern, true);
    END IF;
    IF headers IS NOT NULL THEN
        v_hdr := jetgres.headers_bytes(headers);
    END IF;
    IF v_max > 0 AND octet_length(v_data) + coalesce(octet_length(v_hdr), 0) > v_max THEN
        RAISE EXCEPTION 'jetgres.publish: message of % bytes exceeds the stream''s max_msg_size of %',
            octet_length(v_data) + coalesce(octet_length(v_hdr), 0), v_max
            USING ERRCODE = 'JG003';
    END IF;
    IF v_target = 0 THEN
        INSERT INTO jetgres.staged_0 (call, stream_id, subject, hdr, data)
        VALUES (nextval('jetgres.staged_call'), v_stream, subject, v_hdr, v_data);
    ELSE
        INSERT INTO jetgres.staged_1 (call, stream_id, subject, hdr, data)
        VALUES (nextval('jetgres.staged_call'), v_stream, subject, v_hdr, v_data);
    END IF;
    -- Once per transaction, after its first insert gave it its id: a mover that was awake
    -- then waits for this transaction after letting go. The notification is delivered only
    -- if the transaction commits.
    IF v_first THEN
        IF pg_try_advisory_lock_shared(7666661928317842179) THEN
            PERFORM pg_advisory_unlock_shared(7666661928317842179);
            PERFORM pg_notify('jetgres_staged', '');
        END IF;
    END IF;
END $$;

-- The overloads are sql functions that only convert, and are neither SECURITY DEFINER nor
-- SET anything, so that PostgreSQL inlines them into the caller's statement: a call costs
-- one function call, the one above, rather than two.
CREATE FUNCTION jetgres.publish(subject text, data text, headers jsonb DEFAULT NULL)
RETURNS void
LANGUAGE sql VOLATILE AS $$
    SELECT jetgres.publish(subject, pg_catalog.convert_to(data, 'UTF8'), headers)
$$;

CREATE FUNCTION jetgres.publish(subject text, data jsonb, headers jsonb DEFAULT NULL)
RETURNS void
LANGUAGE sql VOLATILE AS $$
    SELECT jetgres.publish(subject, pg_catalog.convert_to(CAST(data AS text), 'UTF8'), headers)
$$;

-- Every staged row the mover may take now, in the order it takes them: after its progress,
-- in transactions that ended before every transaction still running.
CREATE FUNCTION jetgres.staged_ready(p_limit integer)
RETURNS TABLE (xid xid8, call bigint, stream_id bigint, subject text, hdr bytea, data bytea)
LANGUAGE sql STABLE AS $$
    WITH p AS (SELECT st.moved_xid, st.moved_call, pg_snapshot_xmin(pg_current_snapshot()) AS horizon
               FROM jetgres.staging st)
    SELECT r.* FROM (
        SELECT s.xid, s.call, s.stream_id, s.subject, s.hdr, s.data FROM jetgres.staged_0 s, p
        WHERE (s.xid, s.call) > (p.moved_xid, p.moved_call) AND s.xid < p.horizon
        UNION ALL
        SELECT s.xid, s.call, s.stream_id, s.subject, s.hdr, s.data FROM jetgres.staged_1 s, p
        WHERE (s.xid, s.call) > (p.moved_xid, p.moved_call) AND s.xid < p.horizon
    ) r
    ORDER BY r.xid, r.call
    LIMIT p_limit
$$;

-- One step of the staging rotation, run by the mover outside its moves: truncate the table
-- that is not the target once it is drained and no transaction holds it, or else switch the
-- target once it has held rows for p_period. Returns what it did: 'truncated', 'switched',
-- 'busy' (a transaction still holds the other table), 'undrained' or 'idle'.
CREATE FUNCTION jetgres.staging_rotate(p_period interval)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    st        jetgres.staging;
    tg        jetgres.staging_target;
    other     text;
    left_over boolean;
BEGIN
    SELECT * INTO st FROM jetgres.staging FOR UPDATE;
    SELECT * INTO tg FROM jetgres.staging_target;
    other := format('staged_%s', 1 - tg.target);
    -- By size, not by rows: rolled-back rows are invisible but take space all the same.
    IF pg_relation_size(format('jetgres.%I', other)::regclass) > 0 THEN
        BEGIN
            EXECUTE format('LOCK TABLE jetgres.%I IN ACCESS EXCLUSIVE MODE NOWAIT', other);
        EXCEPTION WHEN lock_not_available THEN
            RETURN 'busy';
        END;
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM jetgres.%I s WHERE (s.xid, s.call) > ($1, $2))', other)
            INTO left_over USING st.moved_xid, st.moved_call;
        IF left_over THEN
            RETURN 'undrained';
        END IF;
        EXECUTE format('TRUNCATE jetgres.%I', other);
        RETURN 'truncated';
    END IF;
    IF now() - tg.switched < p_period THEN
        RETURN 'idle';
    END IF;
    IF pg_relation_size(format('jetgres.staged_%s', tg.target)::regclass) = 0 THEN
        RETURN 'idle';
    END IF;
    UPDATE jetgres.staging_target SET target = 1 - target, switched = now();
    RETURN 'switched';
END $$;

-- Reading with SQL. A set-returning function rather than a view: a view over every chunk
-- table would have to be rewritten whenever a chunk is created (in a publish transaction)
-- and before one is dropped (a table a view names cannot be dropped), putting DDL on the
-- hot path. The function takes the filters instead, and passes them into the statement it
-- runs on each chunk, where the (seq) and (subject, seq) indexes serve them: from_seq,
-- filter (a literal subject uses the index; a filter with wildcards is matched row by
-- row) and max_msgs, which stops reading once that many rows are returned.
CREATE FUNCTION jetgres.messages(stream text, from_seq bigint DEFAULT NULL, filter text DEFAULT NULL,
                                 max_msgs bigint DEFAULT NULL)
RETURNS TABLE (seq bigint, subject text, headers jsonb, data bytea, published timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_id   bigint;
    v_from bigint;
    v_last bigint;
    v_tab  text;
    v_cond text;
    v_left bigint := coalesce(max_msgs, 9223372036854775807);
    v_got  bigint;
BEGIN
    SELECT s.id, greatest(st.first_seq, coalesce(messages.from_seq, 0)), st.last_seq
    INTO v_id, v_from, v_last
    FROM jetgres.streams s JOIN jetgres.stream_state st ON st.stream_id = s.id
    WHERE s.name = messages.stream;
    IF v_id IS NULL THEN
        RETURN;
    END IF;
    v_cond := CASE
        WHEN messages.filter IS NULL OR messages.filter = '>' THEN ''
        WHEN messages.filter ~ '(^|\.)[*>](\.|$)' THEN ' AND m.subject ~ $6'
        ELSE ' AND m.subject = $4' END;
    FOR v_tab IN SELECT l.chunk_table FROM jetgres.live_chunks(v_id, v_from) l LOOP
        EXIT WHEN v_left <= 0;
        BEGIN
            RETURN QUERY EXECUTE format(
                'SELECT m.seq, m.subject, jetgres.headers_jsonb(m.hdr), m.data, to_timestamp(m.ts / 1e9::float8)
                 FROM jetgres.%I m
                 WHERE m.seq >= $1 AND m.seq <= $2%s
                   AND (SELECT NOT EXISTS (SELECT 1 FROM jetgres.deleted d WHERE d.stream_id = $3 AND d.seq = m.seq))
                 ORDER BY m.seq LIMIT $5', v_tab, v_cond)
                USING v_from, v_last, v_id, messages.filter, v_left, jetgres.subject_regexp(messages.filter);
        EXCEPTION WHEN undefined_table THEN
            -- Retention dropped the chunk after it was listed: everything in it is gone.
            CONTINUE;
        END;
        GET DIAGNOSTICS v_got = ROW_COUNT;
        v_left := v_left - v_got;
    END LOOP;
END $$;

CREATE VIEW jetgres.stream_list AS
    SELECT s.name, jetgres.stream_subjects(s.name, s.config) AS subjects,
           st.msgs AS messages, st.bytes, st.first_seq, st.last_seq
    FROM jetgres.streams s JOIN jetgres.stream_state st ON st.stream_id = s.id;

-- pending counts the stream's live messages above the ack floor, of every subject: for a
-- consumer with a filter it is an upper bound.
CREATE VIEW jetgres.consumer_list AS
    SELECT s.name AS stream, c.name, c.ack_stream_seq AS ack_floor,
           greatest(st.last_seq - greatest(c.ack_stream_seq, st.first_seq - 1), 0)
             - (SELECT count(*) FROM jetgres.deleted d
                WHERE d.stream_id = s.id AND d.seq > greatest(c.ack_stream_seq, st.first_seq - 1)
                  AND d.seq <= st.last_seq) AS pending
    FROM jetgres.consumers c
    JOIN jetgres.streams s ON s.id = c.stream_id
    JOIN jetgres.stream_state st ON st.stream_id = c.stream_id;

REVOKE ALL ON FUNCTION jetgres.publish(text, bytea, jsonb), jetgres.publish(text, text, jsonb),
    jetgres.publish(text, jsonb, jsonb), jetgres.messages(text, bigint, text, bigint) FROM PUBLIC;

-- Roles are cluster-wide: created once, by the first database migrated on the cluster whose
-- migrating role may create roles, and granted to in every database. Without the right to
-- create roles, an administrator creates them (CREATE ROLE jetgres_publisher NOLOGIN;
-- CREATE ROLE jetgres_reader NOLOGIN) and runs SELECT jetgres.grant_sql_roles().
CREATE FUNCTION jetgres.grant_sql_roles()
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'jetgres_publisher') THEN
        GRANT USAGE ON SCHEMA jetgres TO jetgres_publisher;
        GRANT EXECUTE ON FUNCTION jetgres.publish(text, bytea, jsonb), jetgres.publish(text, text, jsonb),
            jetgres.publish(text, jsonb, jsonb) TO jetgres_publisher;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'jetgres_reader') THEN
        GRANT USAGE ON SCHEMA jetgres TO jetgres_reader;
        GRANT EXECUTE ON FUNCTION jetgres.messages(text, bigint, text, bigint) TO jetgres_reader;
        GRANT SELECT ON jetgres.stream_list, jetgres.consumer_list TO jetgres_reader;
    END IF;
END $$;

DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['jetgres_publisher', 'jetgres_reader'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = current_user AND (rolsuper OR rolcreaterole)) THEN
                BEGIN
                    EXECUTE format('CREATE ROLE %I NOLOGIN', r);
                EXCEPTION WHEN duplicate_object OR unique_violation THEN
                    NULL; -- another database's migration created it at the same moment
                END;
            ELSE
                RAISE WARNING 'jetgres: role % does not exist and % may not create it; see jetgres.grant_sql_roles()', r, current_user;
            END IF;
        END IF;
    END LOOP;
    PERFORM jetgres.grant_sql_roles();
END $$;
