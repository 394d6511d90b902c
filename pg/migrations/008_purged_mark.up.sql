-- Whether a purge emptied a stream before it ever held a message. JetStream reports such a
-- stream with first_seq 1 (its first sequence moved past the last, 0), and one never purged
-- with first_seq 0; first_seq and last_seq alone cannot tell the two apart. A full purge
-- sets it, as do a create that gives first_seq (1 included) and the last consumer of an
-- interest stream going, which JetStream answers with a purge. It matters only while
-- last_seq is 0.
ALTER TABLE jetgres.stream_state ADD COLUMN purged boolean NOT NULL DEFAULT false;
