package stream

import (
	"context"

	"github.com/jetgres/jetgres/pg"
)

// ServerChanged takes pg's word that the database is served by another server than before
// (a standby promoted in place of the primary; see pg.DB.OnServerChange) and drops what the
// streams hold in memory of the old one, before the connection that found the change runs
// anything. A stream whose last sequence there is below the high-water mark its tail saw
// lost its last commits: the new server will give those sequences to other messages. That is
// logged and counted. Each tail and get index then start again from the new server's
// sequences, and every subscriber hears an empty Purged (what it holds may be wrong in any
// way): the consumers forget what they read ahead. Their positions come back
// from the new server when the ownership fence, which the lost session sets off, serves them
// again.
//
// It runs on whatever goroutine opens a connection. An empty Purged reads nothing, and its
// subscribers take only locks that are never held across a database call.
func (r *Registry) ServerChanged(ch pg.ServerChange) {
	r.m.serverChanges.Inc()
	streams := r.List()
	behind, lost := 0, uint64(0)
	for _, s := range streams {
		b, ok := ch.Streams[s.id]
		if !ok {
			r.log.Warn("the database is behind what this process saw: a stream is missing there", "stream", s.name, "server", ch.To)
			continue
		}
		if saw := s.tail.HighWater(); b.Last < saw {
			behind++
			lost += saw - b.Last
			r.log.Warn("the database is behind what this process saw: the stream's last commits are lost, and their sequences will go to new messages",
				"stream", s.name, "last_seq_seen", saw, "last_seq_now", b.Last, "server", ch.To)
		}
		s.tail.Rewind(b.Last)
		s.gets.Rewound(b.First, b.Last)
		s.Purge(r.flushCtx, Purged{})
	}
	if behind > 0 {
		r.m.rewinds.Inc()
		r.m.rewound.Add(float64(lost))
	}
	r.log.Warn("the database is served by another server: the streams' tails and indexes are rebuilt from it",
		"server_before", ch.From, "server_now", ch.To, "streams", len(streams), "streams_behind", behind, "sequences_lost", lost)
}

// Restored tells s that its messages were stored behind its tail, by a restore from a
// backup, and that first and last are its sequences now: its tail and get index start again
// from them, and every subscriber hears an empty Purged, as after ServerChanged.
func (r *Registry) Restored(ctx context.Context, s *Stream, first, last uint64) {
	s.tail.Rewind(last)
	s.gets.Rewound(first, last)
	s.Purge(ctx, Purged{})
}

// Copied announces a mirror's batch, stored after prev, the stream's last sequence before
// it, as Commit announces an append: the messages join the tail and the get index, and the
// consumers are woken for them and keep what they read ahead. The sequences between prev
// and the first message were skipped, not missed.
func (r *Registry) Copied(s *Stream, prev, first, last uint64, msgs []pg.Message) {
	if len(msgs) == 0 {
		return
	}
	s.committed(Committed{From: prev + 1, First: first, Last: last, Stored: msgs})
}
