-- A consumer's delivered position, beside its ack floor: the serving replica raises it in
-- steps ahead of what it delivers and delivers past it only once the raise committed, so
-- that a replica taking the consumer over (or a restart after a crash) knows what may have
-- gone out. It treats what lies between the ack floor and this mark as delivered once and
-- redelivers it after its ack wait; it never delivers it again as new.
ALTER TABLE jetgres.consumers
    ADD COLUMN dlv_stream_seq   bigint NOT NULL DEFAULT 0,
    ADD COLUMN dlv_consumer_seq bigint NOT NULL DEFAULT 0;
