// Package sharedread lets consumers of one stream that read PostgreSQL from the same
// position with the same filters at the same time share one read: consumers created
// together at the start of a backlog (a key-value bucket's watchers, a deliver group's
// consumers restarted at once) would otherwise read the same rows each. The consumer engine
// (bridge/consumer) keeps one Reads per stream and gives it the read to make.
//
// # Locks
//
// Reads.mu is the only lock, a leaf: the read itself runs, and joiners wait, with it
// released.
package sharedread

import (
	"context"
	"slices"
	"strings"
	"sync"

	"github.com/jetgres/jetgres/pg"
)

// Reads lets consumers of one stream that read PostgreSQL from the same position with the
// same filters at the same time share one read. The zero value is ready.
type Reads struct {
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

// ReadFunc reads the messages of [p.From, p.UpTo] that match filters, and the sequence
// through which it looked.
type ReadFunc func(ctx context.Context, p pg.ReadParams, filters []string) ([]pg.Message, uint64, error)

// Read reads [p.From, p.UpTo] with read, or joins the same read in flight; joined reports
// that it did. The messages are shared read-only, and clipped so that a consumer appending
// to them copies.
func (r *Reads) Read(ctx context.Context, p pg.ReadParams, filters []string, read ReadFunc) (msgs []pg.Message, through uint64, joined bool, err error) {
	key := readKey{from: p.From, filters: strings.Join(filters, "\x00")}
	r.mu.Lock()
	if sr := r.inFlight[key]; sr != nil {
		r.mu.Unlock()
		select {
		case <-sr.done:
			return sr.msgs, sr.through, true, sr.err
		case <-ctx.Done():
			return nil, 0, false, ctx.Err()
		}
	}
	sr := &sharedRead{done: make(chan struct{})}
	if r.inFlight == nil {
		r.inFlight = make(map[readKey]*sharedRead)
	}
	r.inFlight[key] = sr
	r.mu.Unlock()
	sr.msgs, sr.through, sr.err = read(ctx, p, filters)
	sr.msgs = slices.Clip(sr.msgs)
	r.mu.Lock()
	if r.inFlight[key] == sr {
		delete(r.inFlight, key)
	}
	r.mu.Unlock()
	close(sr.done)
	return sr.msgs, sr.through, false, sr.err
}

// Forget keeps reads already in flight from being joined: after a purge, rows they return
// may be gone, and a consumer that heard of the purge must read anew. Those that joined
// before hear of the purge after their read, as for a read of their own.
func (r *Reads) Forget() {
	r.mu.Lock()
	defer r.mu.Unlock()
	clear(r.inFlight)
}
