-- Per-message TTLs (the Nats-TTL header, issue 30). A message published with a TTL gets a
-- row here in the transaction that stores it: when it expires, in Unix nanoseconds on
-- PostgreSQL's clock, or NULL for "never", which max_age then passes over. Message rows stay
-- insert-only: the maintainer finds what expired by the expiry index, tombstones it as any
-- other out-of-order removal, and deletes the rows it handled here, off the publish path.
CREATE TABLE jetgres.msg_ttl (
    stream_id  bigint NOT NULL REFERENCES jetgres.streams (id) ON DELETE CASCADE,
    seq        bigint NOT NULL,
    expires    bigint,
    PRIMARY KEY (stream_id, seq)
);

CREATE INDEX msg_ttl_expires ON jetgres.msg_ttl (stream_id, expires) WHERE expires IS NOT NULL;
