package consumer

import (
	"context"
	"slices"
	"strings"
	"sync"

	"github.com/jetgres/jetgres/pg"
)

// sharedReads lets consumers of one stream that read PostgreSQL from the same position
// with the same filters at the same time share one read: consumers created together at
// the start of a backlog (a key-value bucket's watchers, a deliver group's consumers
// restarted at once) would otherwise read the same rows each. The lock is a leaf.
type sharedReads struct {
	mu       sync.Mutex
	inFlight map[readKey]*sharedRead
}

// readKey says which reads may share: the same first sequence and the same filters. The
// last sequence and the count may differ, since whatever a read returns is true for every
// consumer with those filters: the messages it found, and that none matched between them
// and the sequence through which it looked.
type readKey struct {
	from    uint64
	filters string
}

// sharedRead is a read in flight; msgs, through and err are set before done closes.
type sharedRead struct {
	done    chan struct{}
	msgs    []pg.Message
	through uint64
	err     error
}

// read reads [p.From, p.UpTo] through the pop lane, or joins the same read in flight. The
// messages are shared read-only, and clipped so that a consumer appending to them copies.
func (r *sharedReads) read(ctx context.Context, cs *Engine, p pg.ReadParams, filters []string) ([]pg.Message, uint64, error) {
	key := readKey{from: p.From, filters: strings.Join(filters, "\x00")}
	r.mu.Lock()
	if sr := r.inFlight[key]; sr != nil {
		r.mu.Unlock()
		select {
		case <-sr.done:
			cs.m.ReadsShared.Inc()
			return sr.msgs, sr.through, sr.err
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		}
	}
	sr := &sharedRead{done: make(chan struct{})}
	if r.inFlight == nil {
		r.inFlight = make(map[readKey]*sharedRead)
	}
	r.inFlight[key] = sr
	r.mu.Unlock()
	sr.msgs, sr.through, sr.err = cs.ReadPop(ctx, p, filters)
	sr.msgs = slices.Clip(sr.msgs)
	r.mu.Lock()
	if r.inFlight[key] == sr {
		delete(r.inFlight, key)
	}
	r.mu.Unlock()
	close(sr.done)
	return sr.msgs, sr.through, sr.err
}

// forget keeps reads already in flight from being joined: after a purge, rows they return
// may be gone, and a consumer that heard of the purge must read anew. Those that joined
// before hear of the purge after their read, as for a read of their own.
func (r *sharedReads) forget() {
	r.mu.Lock()
	defer r.mu.Unlock()
	clear(r.inFlight)
}
