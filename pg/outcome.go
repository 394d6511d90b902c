package pg

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrOutcomeUnknown is returned (wrapped, by an *OutcomeUnknownError) by Append and
// MoveStaged when the statement that commits had been sent and no answer came back: the
// connection broke, or the statement timeout ended the wait, or the server ended the session
// with a FATAL error, which it may send after a commit. The transaction may have committed or
// not; Resolve finds out which.
var ErrOutcomeUnknown = errors.New("pg: commit outcome unknown")

// OutcomeUnknownError is an append whose transaction's outcome is unknown. It keeps what the
// transaction would have stored and which session ran it, for Resolve.
type OutcomeUnknownError struct {
	err     error
	batches []inDoubt
	// together says that the batches committed or not as one: the general path's
	// transaction. The fast path's statement stores each batch only if its stream's state row
	// is as this process remembered it, so there one batch found stored says nothing of
	// another.
	together bool
	session  session
}

func (e *OutcomeUnknownError) Error() string { return ErrOutcomeUnknown.Error() + ": " + e.err.Error() }

func (e *OutcomeUnknownError) Unwrap() []error { return []error{ErrOutcomeUnknown, e.err} }

// Streams lists the streams whose batches the transaction carried.
func (e *OutcomeUnknownError) Streams() []int64 {
	ids := make([]int64, len(e.batches))
	for i, b := range e.batches {
		ids[i] = b.res.StreamID
	}
	return ids
}

// inDoubt is one batch of a transaction whose outcome is unknown.
type inDoubt struct {
	res    AppendResult // what Append returns for the batch once the transaction committed
	before uint64       // the stream's last sequence before the batch
	// probe is the newest row the batch inserts, in chunk, when it inserts one (probed).
	probe  Message
	probed bool
	chunk  int64
}

// allocates reports whether the batch takes sequences: one that does not (every message a
// duplicate or refused, or its stream gone) writes nothing, and its answers are the same
// whether its transaction committed or not.
func (b *inDoubt) allocates() bool { return !b.res.Gone && b.res.LastSeq > b.before }

// session names a backend, apart from any later one that reuses its pid.
type session struct {
	pid     uint32
	started time.Time
}

// backendStarted is the key of a connection's custom data that holds when its backend
// started (see noteSession).
const backendStarted = "jetgres.backend_started"

// noteSession runs on every new connection: it records when the connection's backend started,
// which with its pid names the session for Resolve.
func noteSession(ctx context.Context, c *pgx.Conn) error {
	var started time.Time
	if err := c.QueryRow(ctx, `SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()`).Scan(&started); err != nil {
		return fmt.Errorf("reading when the backend started: %w", err)
	}
	c.PgConn().CustomData()[backendStarted] = started
	return nil
}

func sessionOf(q querier) session {
	c, ok := q.(interface{ PgConn() *pgconn.PgConn })
	if !ok {
		return session{}
	}
	started, _ := c.PgConn().CustomData()[backendStarted].(time.Time)
	return session{pid: c.PgConn().PID(), started: started}
}

// refused reports whether err, from the call that sent a transaction's commit (COMMIT, or the
// statement of an implicit transaction), proves that the transaction did not commit: nothing
// of the call was written (pgx's SafeToRetry), pgx stopped before it sent the statements (a
// prepare that failed, an argument it could not encode), or the server answered the
// transaction with an error, which rolls it back. A statement the server cancelled for the
// statement timeout is one of those (SQLSTATE 57014). Anything else leaves the outcome unknown:
// a connection that broke or timed out after the write, or a FATAL error, which ends the
// session and may follow a commit.
func refused(err error) bool {
	if pgconn.SafeToRetry(err) {
		return true
	}
	if _, ok := errors.AsType[pgx.ErrPreprocessingBatch](err); ok {
		return true
	}
	if pe, ok := errors.AsType[*pgconn.PgError](err); ok {
		severity := pe.SeverityUnlocalized
		if severity == "" {
			severity = pe.Severity
		}
		return severity == "ERROR"
	}
	return false
}

// commitFailed is what the caller of a transaction whose commit call failed with err must be
// told: err when it proves that the transaction did not commit, an *OutcomeUnknownError
// otherwise. In the latter case what this process remembers of the streams (the last state it
// committed, their chunks and subject indexes) may be behind the database, and is forgotten.
func (db *DB) commitFailed(q querier, err error, together bool, batches []inDoubt) error {
	if refused(err) {
		return err
	}
	for _, b := range batches {
		db.forgetState(b.res.StreamID)
	}
	return &OutcomeUnknownError{err: err, batches: batches, together: together, session: sessionOf(q)}
}

// forgetState drops what this process remembers of a stream's state, so that the next append
// reads it again.
func (db *DB) forgetState(id int64) {
	db.tails.forget(id)
	db.chunks.forget(id)
	db.subjects.forget(id)
	db.lasts.forget(id)
}

// Resolution is what Resolve found of the batches of an append whose outcome was unknown. A
// batch in neither list stays unknown: the rows that would tell are gone (retention removed
// them, or the stream was deleted).
type Resolution struct {
	// Stored holds the results of the batches found stored, as Append returns them.
	Stored []AppendResult
	// NotStored lists the streams whose batches were found not stored.
	NotStored []int64
}

const (
	// resolveRetryMin and resolveRetryMax bound the pause between Resolve's attempts while the
	// database is unavailable, doubling from one to the other.
	resolveRetryMin = 50 * time.Millisecond
	resolveRetryMax = time.Second
	// sessionPoll is how often Resolve looks whether the session it ended is gone.
	sessionPoll = 10 * time.Millisecond
)

// Resolve finds out which batches of e's transaction are stored. It first ends the session
// that ran the transaction, if that session is still there, and waits until it is gone: until
// then the server may yet run a commit that the session has read, or that is still on its way
// to it, and no look at the rows could be trusted; a session ended before it ran its commit
// rolls the transaction back. Then it reads, for each batch, its stream's last sequence and the
// row at the sequence of the newest message the batch inserts: that row holding the batch's
// message (its store time, subject, header, payload and byte count alike) proves the batch
// stored; another message there, or a last sequence short of it, proves it not stored. Rows
// are compared, not counts, because other replicas append to the same streams meanwhile.
//
// It keeps trying while the database is unavailable (during a failover, say), for up to
// Config.StmtTimeout, and returns an error wrapping ErrOutcomeUnknown when it could not look.
// It runs outside the flow limiter, like the background work.
func (db *DB) Resolve(ctx context.Context, e *OutcomeUnknownError) (Resolution, error) {
	deadline := time.Now().Add(db.cfg.StmtTimeout)
	var err error
	for pause := resolveRetryMin; ; pause = min(2*pause, resolveRetryMax) {
		// A timeout of zero would be none at all.
		remaining := time.Until(deadline)
		if remaining <= 0 {
			break
		}
		var seen []readBack
		_, err = db.runRetry(ctx, remaining, func(ctx context.Context, q querier) error {
			if err := endSession(ctx, q, e.session); err != nil {
				return err
			}
			var err error
			seen, err = readBackBatches(ctx, q, e.batches)
			return err
		})
		if err == nil {
			return e.resolve(seen), nil
		}
		if !errors.Is(err, ErrUnavailable) || time.Until(deadline) < pause {
			break
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return Resolution{}, fmt.Errorf("%w: reading it back: %w", ErrOutcomeUnknown, ctx.Err())
		case <-t.C:
		}
	}
	return Resolution{}, fmt.Errorf("%w: reading it back: %w", ErrOutcomeUnknown, err)
}

// endSession ends the session s, if the server still has it, and returns once it is gone. A
// session of another server (after a failover) is not found, and needs nothing: the old
// primary's commits are on this one or nowhere. A session waiting for synchronous
// replication has committed locally and waits for the standby: ended there, it would leave
// a commit that the standby may not have, which the read-back would then acknowledge, so
// it is left to finish.
func endSession(ctx context.Context, q querier, s session) error {
	if s.pid == 0 || s.started.IsZero() {
		return nil
	}
	for {
		rows, err := q.Query(ctx, `SELECT CASE WHEN wait_event IS DISTINCT FROM 'SyncRep' THEN pg_terminate_backend(pid) END
			FROM pg_stat_activity WHERE pid = $1 AND backend_start = $2`, int64(s.pid), s.started)
		if err != nil {
			return fmt.Errorf("ending the session of the transaction: %w", err)
		}
		alive := rows.Next()
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("ending the session of the transaction: %w", err)
		}
		if !alive {
			return nil
		}
		t := time.NewTimer(sessionPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("waiting for the session of the transaction to end: %w", context.Cause(ctx))
		case <-t.C:
		}
	}
}

// readBack is what Resolve read for one batch.
type readBack struct {
	exists            bool // the stream's state row
	firstSeq, lastSeq uint64
	row               *Message // at the probe's sequence, when the batch has a probe and the row is there
}

func readBackBatches(ctx context.Context, q querier, batches []inDoubt) ([]readBack, error) {
	seen := make([]readBack, len(batches))
	for i, b := range batches {
		if !b.allocates() {
			continue
		}
		var chunk, seq *int64
		if b.probed {
			c, s := b.chunk, int64(b.probe.Seq)
			chunk, seq = &c, &s
		}
		var first, last int64
		var ts, cum *int64
		var subject *string
		var hdr, data []byte
		err := q.QueryRow(ctx, `SELECT s.first_seq, s.last_seq, m.ts, m.subject, m.hdr, m.data, m.cum_before
			FROM jetgres.stream_state s LEFT JOIN jetgres.msgs m ON m.stream_id = s.stream_id AND m.chunk = $2 AND m.seq = $3
			WHERE s.stream_id = $1`, customPlan, b.res.StreamID, chunk, seq).Scan(&first, &last, &ts, &subject, &hdr, &data, &cum)
		if errors.Is(err, pgx.ErrNoRows) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading back stream %d: %w", b.res.StreamID, err)
		}
		r := &seen[i]
		r.exists, r.firstSeq, r.lastSeq = true, uint64(first), uint64(last)
		if ts != nil {
			r.row = &Message{Seq: b.probe.Seq, TS: *ts, Subject: *subject, Header: hdr, Data: data, cumBefore: uint64(*cum)}
		}
	}
	return seen, nil
}

type verdict uint8

const (
	unknown verdict = iota
	stored
	notStored
)

// verdict is what one batch's read-back proves of it.
func (b *inDoubt) verdict(r readBack) verdict {
	switch {
	case !r.exists:
		return unknown
	case !b.probed:
		// Every message it took a sequence for was one no consumer wanted, and left no row.
		if r.lastSeq <= b.before {
			return notStored
		}
		return unknown
	case r.row != nil:
		if sameMessage(r.row, &b.probe) {
			return stored
		}
		return notStored
	case r.lastSeq < b.probe.Seq:
		// Last sequences only grow: nobody has taken this one yet.
		return notStored
	}
	return unknown
}

// sameMessage compares two rows by what a message's row holds. The store time is this
// process's clock in nanoseconds and the byte count the stream's history: another replica's
// message at the same sequence matches in neither, even with the same subject and payload.
func sameMessage(a, b *Message) bool {
	return a.TS == b.TS && a.cumBefore == b.cumBefore && a.Subject == b.Subject &&
		bytes.Equal(a.Header, b.Header) && bytes.Equal(a.Data, b.Data)
}

// resolve turns what was read back into the resolution.
func (e *OutcomeUnknownError) resolve(seen []readBack) Resolution {
	verdicts := make([]verdict, len(e.batches))
	for i := range e.batches {
		if e.batches[i].allocates() {
			verdicts[i] = e.batches[i].verdict(seen[i])
		} else {
			verdicts[i] = stored
		}
	}
	if e.together {
		all, contradicted := unknown, false
		for i := range e.batches {
			if !e.batches[i].allocates() || verdicts[i] == unknown {
				continue
			}
			contradicted = contradicted || all != unknown && all != verdicts[i]
			all = verdicts[i]
		}
		if contradicted {
			all = unknown
		}
		for i := range verdicts {
			if e.batches[i].allocates() {
				verdicts[i] = all
			}
		}
	}
	var out Resolution
	for i, b := range e.batches {
		switch verdicts[i] {
		case stored:
			res := b.res
			if r := seen[i]; r.exists && r.firstSeq > res.FirstSeq {
				// Retention moved the stream's first sequence since (it told of that
				// itself), or before the fast path's statement, which reads it.
				res.FirstSeq = r.firstSeq
				res.Stored = slices.DeleteFunc(slices.Clone(res.Stored), func(m Message) bool { return m.Seq < r.firstSeq })
			}
			out.Stored = append(out.Stored, res)
		case notStored:
			out.NotStored = append(out.NotStored, b.res.StreamID)
		}
	}
	return out
}
