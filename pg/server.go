package pg

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// A replicated PostgreSQL can be replaced under the same URL: a standby promoted by an
// operator or by Patroni, reached through a URL of several hosts with
// target_session_attrs=read-write, or another cluster restored from a backup. Every
// promotion starts a new timeline, and every cluster has a system identifier of its own, so
// each new connection reads both of the server it reached, and the first connection to find
// others than before stops there, before any statement of jetgres's runs on it: pg
// forgets what it remembers of every stream (the fast path's last state, chunk lists,
// subject indexes and sets), reads each stream's sequences as the new server holds them,
// and tells the handler set with OnServerChange, whose caller compares those with what it
// saw. A synchronous standby holds every commit that was answered, and the sequences match;
// an asynchronous one may lack the last commits, whose sequences the new server will give
// to other messages.

// ServerChange says that the database is now served by another PostgreSQL server than
// before: a standby promoted in place of the primary.
type ServerChange struct {
	// From and To name the server before and now: its cluster's system identifier and its
	// timeline, as PostgreSQL names it in its WAL file names ("7583190581230938112/00000002").
	From, To string
	// Streams is each stream's sequences as the new server holds them, by stream id.
	Streams map[int64]SeqBounds
}

// SeqBounds are a stream's first and last sequences.
type SeqBounds struct {
	First, Last uint64
}

// serverWatch is the server the pool's connections last reached and the handler of a
// change. mu serialises the connections that find a new server, so that one handles it and
// the others wait until it has.
type serverWatch struct {
	mu      sync.Mutex
	server  string
	handler atomic.Pointer[func(ServerChange)]
	changes atomic.Int64
	// left is the servers the pool's connections reached before server, replaced whole at
	// each change, for readers that must not wait for a change being handled.
	left atomic.Pointer[map[string]bool]
}

// set records the server the pool's connections reach now; mu is held.
func (w *serverWatch) set(server string) {
	if w.server != "" {
		left := make(map[string]bool)
		if old := w.left.Load(); old != nil {
			maps.Copy(left, *old)
		}
		left[w.server] = true
		w.left.Store(&left)
	}
	w.server = server
}

// abandoned reports whether server, which a connection of its own reached, is one the
// pool's connections have left for another. A connection that reached the new server before
// any of the pool's did is not: the pool finds it at its next connection.
func (w *serverWatch) abandoned(server string) bool {
	left := w.left.Load()
	return left != nil && (*left)[server]
}

// OnServerChange sets fn to be called when a new connection finds another server than the
// pool's earlier connections did. fn runs on the goroutine that is opening that connection,
// which may be any caller of DB's methods, before the connection runs anything else and
// while other new connections wait: it must be quick, take only locks that are never held
// across a call of DB's, and call no method of DB's.
func (db *DB) OnServerChange(fn func(ServerChange)) {
	db.server.handler.Store(&fn)
}

// ServerChanges counts the changes of server that connections found since Open.
func (db *DB) ServerChanges() int64 { return db.server.changes.Load() }

// serverSQL names the server: its system identifier, and its timeline from the name of its
// current WAL file. A standby has no current WAL position of its own; it answers "" and
// changes nothing, as nothing of jetgres's is written there.
const serverSQL = `SELECT CASE WHEN pg_is_in_recovery() THEN '' ELSE
	(SELECT system_identifier::text FROM pg_control_system()) || '/' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) END`

// noteServer runs on every new connection: it reads which server it reached and, if that is
// another than the one the pool's connections reached before, handles the change.
func (db *DB) noteServer(ctx context.Context, c *pgx.Conn) error {
	var server string
	if err := c.QueryRow(ctx, serverSQL).Scan(&server); err != nil {
		return fmt.Errorf("reading which server the connection reached: %w", err)
	}
	w := &db.server
	w.mu.Lock()
	defer w.mu.Unlock()
	if server == "" || server == w.server {
		return nil
	}
	if w.server == "" {
		w.set(server)
		return nil
	}
	bounds, err := seqBounds(ctx, c)
	if err != nil {
		return fmt.Errorf("reading the streams' sequences on a new server: %w", err)
	}
	db.forgetAll()
	w.changes.Add(1)
	db.log.Warn("PostgreSQL is served by another server than before (a standby was promoted): what this process remembers of the database is read again",
		"server_before", w.server, "server_now", server)
	if fn := w.handler.Load(); fn != nil {
		(*fn)(ServerChange{From: w.server, To: server, Streams: bounds})
	}
	w.set(server)
	return nil
}

// seqBounds reads every stream's first and last sequences on c.
func seqBounds(ctx context.Context, c *pgx.Conn) (map[int64]SeqBounds, error) {
	out := make(map[int64]SeqBounds)
	rows, err := c.Query(ctx, `SELECT stream_id, first_seq, last_seq FROM jetgres.stream_state`)
	if isUndefinedTable(err) {
		// A server without jetgres's schema holds no stream; Migrate makes it.
		return out, nil
	}
	if err != nil {
		return nil, err
	}
	var id, first, last int64
	_, err = pgx.ForEachRow(rows, []any{&id, &first, &last}, func() error {
		out[id] = SeqBounds{First: uint64(first), Last: uint64(last)}
		return nil
	})
	return out, err
}

// forgetAll drops what pg remembers of every stream, as forgetState and the subject sets do
// for one.
func (db *DB) forgetAll() {
	ids := make(map[int64]bool)
	db.tails.mu.Lock()
	for id := range db.tails.m {
		ids[id] = true
	}
	db.tails.mu.Unlock()
	db.chunks.mu.Lock()
	for id := range db.chunks.byID {
		ids[id] = true
	}
	db.chunks.mu.Unlock()
	for _, id := range db.subjects.ids() {
		ids[id] = true
	}
	for _, id := range db.counts.ids() {
		ids[id] = true
	}
	for id := range ids {
		db.forgetState(id)
		db.counts.forget(id)
	}
}
