// Package schedule fires the message schedules of the streams that allow them
// (allow_msg_schedules), as nats-server 2.15 does. A schedule is an ordinary message,
// stored in PostgreSQL like any publish, whose Nats-Schedule header says when it fires
// (package pattern); the stream keeps the newest schedule of each subject (the intake
// stores it with a subject roll-up). When it fires, a message goes to its
// Nats-Schedule-Target with its data and headers, or, with Nats-Schedule-Source, those of
// the last message on that subject; the Nats-Schedule headers, Nats-Expected-*,
// Nats-Msg-Id, Nats-TTL and Nats-Rollup are left out, and Nats-Scheduler (the schedule's
// subject), Nats-Schedule-Next (the next time it fires, or "purge" for one that does not
// repeat), Nats-TTL from Nats-Schedule-TTL and Nats-Rollup from Nats-Schedule-Rollup are
// added. A message that says "Nats-Schedule-Next: purge" purges its Nats-Scheduler's
// subject as it is stored, in its own transaction (stream.Produced, and a client's purge,
// which nats-server refuses unless that subject's last message is a schedule): the
// one-shot schedule goes as it fires, and a client may remove a schedule so too.
//
// # Which replica, and what it remembers
//
// One replica fires a stream's schedules: the one whose ownership session (bridge/ownership)
// holds the stream's scheduler lock, which a replica that dies gives up with its session.
// Each pass it confirms that it still holds it before it fires. It keeps nothing that
// PostgreSQL does not: the replica that takes a stream over reads it from its first
// message, and from then on reads what every replica committed since its last pass. A
// schedule's next time is the one its last produced message names, or, before it fired,
// the one its pattern gives from when it was stored; a time missed while no replica
// fired (a restart) fires once, at once, as in nats-server.
//
// A produced message is appended as the stream's other messages are (one transaction,
// under a permit of the publishes' append lane, announced to its consumers once
// committed), and the replica takes it in at once, as it takes what it reads: a repeating
// schedule moves on to its next time, a one-shot goes. The append expects the schedule to
// be the last message of its subject still, and a one-shot's purges it in the same
// transaction: no crash leaves a one-shot fired with its schedule stored, and of two
// replicas that fire it (one whose session broke as it appended, and the one that took
// the stream over), the second to commit stores nothing. A repeating schedule stays the
// last message of its subject, so one of its times may still fire twice so.
//
// The scan reads subjects and headers only (pg.DB.ReadHeaders); a schedule's data, or its
// source's, is read when it fires. A replica gives up the scheduler lock of a stream that
// is deleted.
//
// # Goroutine and locks
//
// One goroutine, from Start until Stop, runs the passes every Config.Period of the clock
// and owns all state; the package has no locks.
package schedule
