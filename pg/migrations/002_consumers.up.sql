-- A consumer is served by one replica at a time: the one holding its lease. A replica takes
-- a lease that is free, its own, or expired, renews its leases in one statement well before
-- they run out, and writes the cursor only while it holds the lease, so a replica that lost
-- its consumer cannot move the ack floor under the new owner. Owners are stable replica
-- names: a replica restarted after a crash takes its own leases back at once.
ALTER TABLE jetgres.consumers
    ADD COLUMN owner       text        NOT NULL DEFAULT '',
    ADD COLUMN lease_until timestamptz NOT NULL DEFAULT '-infinity';

CREATE INDEX consumers_owner ON jetgres.consumers (owner) WHERE owner <> '';
