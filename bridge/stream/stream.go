// Package stream owns the streams this process serves: the registry that keeps them as
// PostgreSQL stores them, each stream's subject subscriptions on the link, its intake (the
// fusion buffer of publishes waiting for an append transaction), the atomic batches it
// stages until their commit (batch.go), and the flushes that commit the intakes of many
// streams in one transaction and answer every publisher after the commit, each stream's
// tail of newest messages and its get index, and the events a stream announces (Committed,
// Purged, Removed, Dropped) to whoever keeps something of it in memory. When the database
// is served by another server (a standby promoted), ServerChanged starts every tail and get
// index again from what that server holds, and says what it lost. A stream's
// subject_transform and republish are compiled once per configuration (transform.go): the
// first maps the subject a publish is stored under, the second is for bridge/republish,
// whose messages for a stream of this process come back in through PublishLocal (local.go).
//
// A publish runs on the link's read loop and never blocks there: it is checked, buffered
// and, when no append transaction is in flight and the append lane has a permit, flushed at
// once (fire on idle). Otherwise the stream waits in the ready queue; the transaction in
// flight takes it into the next bundle as it ends, or the dispatcher starts one once the
// one in flight has run for Config.FlushOverlapAfter. A stream has one flush in flight at
// most, and its row lock in PostgreSQL orders the flushes of several replicas, so commit
// order is sequence order. A publish refused or failed hears the PubAck error package jserr
// maps its cause to. A counter stream's increments (counter.go) have their totals made in
// the append transaction, from the subject's last value.
//
// # Locks
//
// In the order in which they may be held together:
//
//  1. Registry.adminMu serialises stream create, update and delete and the re-reading of
//     the streams from PostgreSQL, so that overlap checks and subscriptions agree with what
//     is stored. It is held across database calls and the link's Subscribe, which is what
//     it serialises; the API handlers that hold it (LockAdmin) may do the same.
//  2. Registry.mu guards the map of streams by name. Stop holds it while it drops each
//     stream's subscriptions.
//  3. Stream.cfgMu guards a stream's subscriptions; it is held across the link's Subscribe
//     and Unsubscribe.
//  4. intake.mu guards a stream's fusion buffer. Held with it: the ready queue's mu, when a
//     stream that cannot flush at once is queued.
//  5. readyQueue.mu guards the queue of streams waiting for an append permit.
//
// batches.mu guards a stream's staged atomic batches. It is a leaf: nothing is taken while
// it is held, and it is released before a committed batch goes into the intake.
//
// The last two are leaves, intake.mu but for the queue. A stream's tail and get index have
// locks of their own, leaves, taken by the events' subscribers; the subscribers outside the
// package take their own locks, with none of these held but adminMu (see events.go).
package stream

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/bridge/gets"
	"github.com/jetgres/jetgres/bridge/tailcache"
	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/pg"
)

// Stream is one JetStream stream as this process serves it.
type Stream struct {
	id      int64
	name    string
	created time.Time
	ackPfx  []byte

	// cfg is replaced whole, never changed in place: every publish and ack reads it, and
	// a copy of the struct per message cost more than the rest of the check.
	cfg atomic.Pointer[server.StreamConfig]
	// xf is what cfg's subject_transform and republish compile to, replaced with it.
	xf    atomic.Pointer[Transforms]
	cfgMu sync.Mutex // guards subs
	subs  []*leaf.Subscription

	in intake
	// batches is the atomic batches being staged (batch.go).
	batches batches

	// tail is the stream's newest committed messages in memory: publishes put theirs there,
	// consumers that keep up and gets read them there. It is made with the stream and
	// starts when it is first needed (see tailcache.New).
	tail *tailcache.Tail
	// gets answers gets of the stream's messages from its tail and its last sequence per
	// subject, or from PostgreSQL.
	gets *gets.Index
	// subscribers take the stream's events (events.go): the registry's, shared by every
	// stream and never changed once it starts, so that dispatch reads them without a lock.
	subscribers []Subscriber

	// chunkRows is the size of the stream's new chunks, chosen from cfg (pg.ChunkRowsFor)
	// and replaced with it; chunkRowsSet overrides it when positive. chunkClose is the size
	// at which the maintainer closes them (pg.ChunkRowsClose).
	chunkRows    atomic.Int64
	chunkRowsSet atomic.Int64
	chunkClose   atomic.Int64
}

// ID is the stream's id in PostgreSQL.
func (s *Stream) ID() int64 { return s.id }

func (s *Stream) Name() string { return s.name }

// Created is when the stream was created, as PostgreSQL stored it.
func (s *Stream) Created() time.Time { return s.created }

// AckPrefix is the start of the stream's PubAcks, made once.
func (s *Stream) AckPrefix() []byte { return s.ackPfx }

// ConfigView is the stream's configuration, for reading only.
func (s *Stream) ConfigView() *server.StreamConfig { return s.cfg.Load() }

// Config returns a copy of the stream's configuration, for callers that keep or change it.
func (s *Stream) Config() server.StreamConfig { return *s.cfg.Load() }

// SetConfig replaces the stream's configuration; Registry.Resubscribe follows it when the
// subjects changed.
func (s *Stream) SetConfig(cfg server.StreamConfig) {
	s.xf.Store(CompileTransforms(&cfg))
	sizing := chunkSizing(&cfg)
	s.chunkRows.Store(pg.ChunkRowsFor(sizing))
	s.chunkClose.Store(pg.ChunkRowsClose(sizing))
	s.cfg.Store(&cfg)
}

// Tail is the stream's newest committed messages.
func (s *Stream) Tail() *tailcache.Tail { return s.tail }

// Gets is the stream's get index.
func (s *Stream) Gets() *gets.Index { return s.gets }

// ChunkRows is how many messages the stream's new chunks take.
func (s *Stream) ChunkRows() int64 {
	if n := s.chunkRowsSet.Load(); n > 0 {
		return n
	}
	return s.chunkRows.Load()
}

// SetChunkRows makes the stream's next chunks take n messages, whatever its configuration
// (0: as its configuration chooses), for tests and benchmarks that compare chunk sizes.
func (s *Stream) SetChunkRows(n int64) { s.chunkRowsSet.Store(n) }

// ChunkCloseRows is the size at which the maintainer closes the stream's chunks once they
// are pg.ChunkCloseAge old, 0 for none (pg.ChunkRowsClose).
func (s *Stream) ChunkCloseRows() int64 { return s.chunkClose.Load() }

// ChunkRows is the chunk size a stream of configuration cfg takes (pg.ChunkRowsFor).
func ChunkRows(cfg *server.StreamConfig) int64 { return pg.ChunkRowsFor(chunkSizing(cfg)) }

// chunkSizing is what of cfg chunk sizes follow. The subjects the stream can store are
// counted only when none has a wildcard: a subject transform maps each of them to one
// subject.
func chunkSizing(cfg *server.StreamConfig) pg.ChunkSizing {
	n := len(cfg.Subjects)
	for _, subj := range cfg.Subjects {
		if !server.IsValidLiteralSubject(subj) {
			n = 0
			break
		}
	}
	return pg.ChunkSizing{Limits: Limits(cfg), Subjects: n, MaxMsgSize: int64(cfg.MaxMsgSize)}
}

// FlushSince is when the stream's flush in flight started, in the registry clock's Unix
// nanoseconds, or 0 with none.
func (s *Stream) FlushSince() int64 { return s.in.flushSince.Load() }

// unsubscribe drops the stream's subject interest.
func (s *Stream) unsubscribe() {
	s.cfgMu.Lock()
	defer s.cfgMu.Unlock()
	s.unsubscribeLocked()
}

// unsubscribeLocked drops the stream's subject interest; cfgMu is held.
func (s *Stream) unsubscribeLocked() {
	for _, sub := range s.subs {
		_ = sub.Unsubscribe()
	}
	s.subs = nil
}

// subscribe registers interest in the stream's subjects on the link, replacing any it had;
// each publish goes to onPublish.
func (s *Stream) subscribe(link *leaf.Conn, queue string, onPublish func(*Stream, *leaf.Msg)) error {
	s.cfgMu.Lock()
	defer s.cfgMu.Unlock()
	s.unsubscribeLocked()
	for _, subj := range s.ConfigView().Subjects {
		sub, err := link.Subscribe(subj, queue, func(m *leaf.Msg) { onPublish(s, m) })
		if err != nil {
			return fmt.Errorf("subscribe %q: %w", subj, err)
		}
		s.subs = append(s.subs, sub)
	}
	return nil
}
