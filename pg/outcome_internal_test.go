package pg

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// notSent is an error pgx marks as raised before anything was written.
type notSent struct{}

func (notSent) Error() string     { return "write failed before a byte went" }
func (notSent) SafeToRetry() bool { return true }

// Only an error that proves the transaction did not commit may be answered as a failure;
// anything else from the call that sent the commit leaves the outcome unknown.
func TestRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"nothing written", notSent{}, true},
		{"a prepare or an argument failed before the statements were sent", pgx.ErrPreprocessingBatch{}, true},
		{"a server error rolls the transaction back", &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "23505"}, true},
		{"a statement timeout the server answered", &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "57014"}, true},
		{"a localized server error", &pgconn.PgError{Severity: "FEHLER", SeverityUnlocalized: "ERROR", Code: "40001"}, true},
		{"a FATAL error may follow a commit", &pgconn.PgError{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "57P01"}, false},
		{"the connection broke mid-read", io.ErrUnexpectedEOF, false},
		{"the wait ended", context.DeadlineExceeded, false},
		{"wrapped as pg wraps it", fmt.Errorf("%w: %w", ErrUnavailable, io.ErrUnexpectedEOF), false},
		{"a wrapped refusal", fmt.Errorf("%w (30s): %w", ErrTimeout, &pgconn.PgError{SeverityUnlocalized: "ERROR", Code: "57014"}), true},
	} {
		if got := refused(tc.err); got != tc.want {
			t.Errorf("%s: refused(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

// An append whose outcome is unknown is read back batch by batch: the row at the newest
// sequence it inserts decides, compared whole, and a transaction's batches share its fate.
func TestResolveVerdicts(t *testing.T) {
	mine := Message{Seq: 12, TS: 1000, Subject: "a", Data: []byte("x"), cumBefore: 300}
	other := mine
	other.TS = 999
	batch := func(id int64, probed bool) inDoubt {
		return inDoubt{res: AppendResult{StreamID: id, LastSeq: 12, Outcomes: []Outcome{{Seq: 12}}}, before: 11, probe: mine, probed: probed}
	}
	for _, tc := range []struct {
		name string
		b    inDoubt
		r    readBack
		want verdict
	}{
		{"its own row", batch(1, true), readBack{exists: true, lastSeq: 12, row: &mine}, stored},
		{"another message at its sequence", batch(1, true), readBack{exists: true, lastSeq: 12, row: &other}, notStored},
		{"its sequence not taken yet", batch(1, true), readBack{exists: true, lastSeq: 11}, notStored},
		{"its row gone since", batch(1, true), readBack{exists: true, lastSeq: 20}, unknown},
		{"its stream gone", batch(1, true), readBack{}, unknown},
		{"no row, no sequence taken", batch(1, false), readBack{exists: true, lastSeq: 11}, notStored},
		{"no row, sequences taken since", batch(1, false), readBack{exists: true, lastSeq: 12}, unknown},
	} {
		if got := tc.b.verdict(tc.r); got != tc.want {
			t.Errorf("%s: verdict %d, want %d", tc.name, got, tc.want)
		}
	}

	quiet := inDoubt{res: AppendResult{StreamID: 3, LastSeq: 5, Outcomes: []Outcome{{Seq: 4, Duplicate: true}}}, before: 5}
	e := &OutcomeUnknownError{err: errors.New("broken"), together: true, batches: []inDoubt{batch(1, true), batch(2, true), quiet}}
	r := e.resolve([]readBack{{exists: true, lastSeq: 12, row: &mine}, {exists: true, lastSeq: 40}, {}})
	if len(r.Stored) != 3 || len(r.NotStored) != 0 {
		t.Errorf("one batch of a transaction found stored: %+v, want all three stored", r)
	}
	r = e.resolve([]readBack{{exists: true, lastSeq: 11}, {exists: true, lastSeq: 40}, {}})
	if len(r.Stored) != 1 || r.Stored[0].StreamID != 3 || len(r.NotStored) != 2 {
		t.Errorf("one batch of a transaction found not stored: %+v, want both not stored, and the duplicate answered", r)
	}
	e.together = false
	r = e.resolve([]readBack{{exists: true, lastSeq: 12, row: &mine}, {exists: true, lastSeq: 40}, {}})
	if len(r.Stored) != 2 || len(r.NotStored) != 0 {
		t.Errorf("fast path, one batch found stored: %+v, want that one and the duplicate, the other unknown", r)
	}
}
