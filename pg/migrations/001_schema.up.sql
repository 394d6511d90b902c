-- Streams, their sequence state, message chunks, de-duplication ids and consumer cursors.
--
-- Message rows are insert-only. A stream's messages live in chunk tables
-- (jetgres.msgs_<stream id>_<chunk number>), listed in jetgres.chunks; retention moves
-- stream_state.first_seq and drops whole chunk tables once nothing can read them. Chunk
-- tables are named by numbers only, so a stream's name never appears in SQL text.

CREATE SCHEMA IF NOT EXISTS jetgres;

CREATE TABLE jetgres.streams (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name       text        NOT NULL UNIQUE,
    config     jsonb       NOT NULL,
    created    timestamptz NOT NULL DEFAULT now(),
    updated    timestamptz NOT NULL DEFAULT now()
);

-- One row per stream, updated once per flush under its row lock. The row lock is what
-- serialises appends to a stream (commit order = sequence order, across replicas). A low
-- fillfactor keeps these updates HOT.
CREATE TABLE jetgres.stream_state (
    stream_id  bigint PRIMARY KEY REFERENCES jetgres.streams (id) ON DELETE CASCADE,
    last_seq   bigint NOT NULL DEFAULT 0,
    last_ts    bigint NOT NULL DEFAULT 0,  -- unix nanoseconds of last_seq
    first_seq  bigint NOT NULL DEFAULT 1,  -- logical first sequence; below it is gone
    cum_bytes  bigint NOT NULL DEFAULT 0,  -- stored bytes of sequences 1..last_seq
    chunk      bigint NOT NULL DEFAULT 0,  -- chunk that receives new messages
    chunk_rows bigint NOT NULL DEFAULT 0,  -- messages written to that chunk so far
    last_msg_id text NOT NULL DEFAULT ''   -- Nats-Msg-Id of last_seq, for Nats-Expected-Last-Msg-Id
) WITH (fillfactor = 50);

CREATE TABLE jetgres.chunks (
    stream_id  bigint NOT NULL REFERENCES jetgres.streams (id) ON DELETE CASCADE,
    chunk      bigint NOT NULL,
    first_seq  bigint NOT NULL,  -- first sequence written to this chunk
    PRIMARY KEY (stream_id, chunk)
);

-- Nats-Msg-Id de-duplication, decided here (memory is only a cache) so that it survives a
-- restart and holds across replicas. Expired ids are overwritten in place or pruned in the
-- background; these rows are not message rows.
CREATE TABLE jetgres.msg_ids (
    stream_id  bigint NOT NULL REFERENCES jetgres.streams (id) ON DELETE CASCADE,
    msg_id     text   NOT NULL,
    seq        bigint NOT NULL,
    ts         bigint NOT NULL,
    PRIMARY KEY (stream_id, msg_id)
);

-- Durable consumers: their configuration and the persisted cursor (the ack floor).
-- Redelivery state beyond the floor is kept in memory; after a crash delivery resumes
-- after the floor (at-least-once).
CREATE TABLE jetgres.consumers (
    stream_id       bigint NOT NULL REFERENCES jetgres.streams (id) ON DELETE CASCADE,
    name            text   NOT NULL,
    config          jsonb  NOT NULL,
    created         timestamptz NOT NULL DEFAULT now(),
    ack_stream_seq  bigint NOT NULL DEFAULT 0,
    ack_consumer_seq bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (stream_id, name)
) WITH (fillfactor = 50);

-- Single messages removed out of order (STREAM.MSG.DELETE, acks under interest or
-- workqueue retention): tombstones that reads skip, dropped with the chunk they fall in.
CREATE TABLE jetgres.deleted (
    stream_id  bigint NOT NULL REFERENCES jetgres.streams (id) ON DELETE CASCADE,
    seq        bigint NOT NULL,
    size       bigint NOT NULL,
    PRIMARY KEY (stream_id, seq)
);
