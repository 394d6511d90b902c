-- Every chunk table becomes a partition of one table, jetgres.msgs, partitioned by
-- (stream_id, chunk): a chunk is the range [(stream, chunk), (stream, chunk + 1)). The hot
-- path (publish, read, get) now names jetgres.msgs only, so each pooled connection prepares
-- its statements once, whatever the number of streams and chunks, and one INSERT stores the
-- messages of many streams in one transaction. The chunk is a column, not a sequence range,
-- because where a chunk ends is decided by the writer as it fills (and by purges that move the
-- last sequence), not known when the chunk is created.
--
-- Retention stays whole-chunk: the maintainer detaches a chunk the stream's first sequence has
-- passed (DETACH … CONCURRENTLY, which does not block the parent's readers and writers) and
-- drops the detached table.
--
-- Existing chunk tables gain the two columns as constant defaults (no rewrite: PostgreSQL
-- stores such a default once, in the catalog, for the rows already there) and are attached
-- where they are; attaching reads each table once to check that its rows belong to it.
CREATE TABLE jetgres.msgs (
    stream_id  bigint NOT NULL,
    chunk      bigint NOT NULL,
    seq        bigint NOT NULL,
    ts         bigint NOT NULL,
    subject    text   COLLATE "C" NOT NULL,
    hdr        bytea,
    data       bytea  NOT NULL,
    cum_before bigint NOT NULL
) PARTITION BY RANGE (stream_id, chunk);

DO $$
DECLARE
    k   record;
    tab text;
BEGIN
    FOR k IN SELECT stream_id, chunk FROM jetgres.chunks ORDER BY stream_id, chunk LOOP
        tab := format('msgs_%s_%s', k.stream_id, k.chunk);
        CONTINUE WHEN to_regclass(format('jetgres.%I', tab)) IS NULL;
        EXECUTE format('ALTER TABLE jetgres.%I ADD COLUMN stream_id bigint NOT NULL DEFAULT %s,
            ADD COLUMN chunk bigint NOT NULL DEFAULT %s', tab, k.stream_id, k.chunk);
        EXECUTE format('ALTER TABLE jetgres.%I ALTER COLUMN stream_id DROP DEFAULT,
            ALTER COLUMN chunk DROP DEFAULT', tab);
        EXECUTE format('ALTER TABLE jetgres.msgs ATTACH PARTITION jetgres.%I FOR VALUES FROM (%s, %s) TO (%s, %s)',
            tab, k.stream_id, k.chunk, k.stream_id, k.chunk + 1);
    END LOOP;
END $$;
