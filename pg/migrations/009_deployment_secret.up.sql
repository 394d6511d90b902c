-- A secret every replica of one deployment reads and no NATS client knows: replicas seal the
-- consumer requests they forward to each other with it, so that a client allowed to publish
-- anywhere cannot pass a request off as forwarded, past the server's permissions on
-- $JS.API. gen_random_uuid draws from PostgreSQL's strong random source.
CREATE TABLE jetgres.deployment (
    one    boolean PRIMARY KEY DEFAULT true CHECK (one),
    secret bytea   NOT NULL
);
INSERT INTO jetgres.deployment (secret)
VALUES (decode(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex'));
