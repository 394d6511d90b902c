-- What consumer info reports as the stream sequence of a consumer's ack floor (and, after a
-- restart, of what it delivered): the last message the consumer took, as nats-server reports
-- it. ack_stream_seq runs on past the messages a filter leaves out, so that a restart does
-- not read them again. NULL, as in every row written before, means the two agree.
ALTER TABLE jetgres.consumers ADD COLUMN shown_stream_seq bigint;
