package jserr

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/pg"
)

// TestAPIErrorMapping checks the mapping from a request's error to the JetStream API error
// clients receive: a database that cannot be reached in time is 503 / 10008, whatever the
// request; the handler's own verdicts pass unchanged; any other failure is the request's
// own error, saying "database error".
func TestAPIErrorMapping(t *testing.T) {
	for _, tc := range []struct {
		name    string
		err     error
		code    int
		errCode server.ErrorIdentifier
		desc    string
	}{
		{"unreachable", fmt.Errorf("consumer %q: %w", "C", fmt.Errorf("%w: acquiring a connection: refused", pg.ErrUnavailable)), 503, server.JSClusterNotAvailErr, "JetStream system temporarily unavailable"},
		{"statement timeout", fmt.Errorf("stream state: %w", errors.Join(pg.ErrTimeout, context.DeadlineExceeded)), 503, server.JSClusterNotAvailErr, "JetStream system temporarily unavailable"},
		{"disk full", fmt.Errorf("stream create: %w", fmt.Errorf("%w: ERROR: could not extend file (SQLSTATE 53100)", pg.ErrDiskFull)), 503, server.JSClusterNotAvailErr, "JetStream system temporarily unavailable"},
		{"request gave up", context.DeadlineExceeded, 503, server.JSClusterNotAvailErr, "JetStream system temporarily unavailable"},
		{"stream not found", server.NewJSStreamNotFoundError(), 404, server.JSStreamNotFoundErr, "stream not found"},
		{"consumer not found", server.NewJSConsumerNotFoundError(), 404, server.JSConsumerNotFoundErr, "consumer not found"},
		{"database refused", errors.New("ERROR: division by zero (SQLSTATE 22012)"), 500, server.JSConsumerCreateErrF, "database error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := API(tc.err, server.NewJSConsumerCreateError)
			if got.Code != tc.code || got.ErrCode != uint16(tc.errCode) || got.Description != tc.desc {
				t.Errorf("API(%v) = %d/%d %q, want %d/%d %q", tc.err, got.Code, got.ErrCode, got.Description, tc.code, tc.errCode, tc.desc)
			}
		})
	}
}

// TestPublishErrors checks the PubAck errors: what a publisher hears for a transaction that
// failed, and for one message a transaction refused.
func TestPublishErrors(t *testing.T) {
	limit := &pg.LimitError{Kind: pg.LimitMsgs}
	for _, tc := range []struct {
		name    string
		got     *server.ApiError
		errCode server.ErrorIdentifier
		desc    string
	}{
		{"timed out", PublishFailed(fmt.Errorf("append: %w", pg.ErrTimeout)), server.JSStreamStoreFailedF, "database timeout"},
		{"unreachable", PublishFailed(pg.ErrUnavailable), server.JSStreamStoreFailedF, "database unavailable"},
		{"disk full", PublishFailed(fmt.Errorf("append: %w", pg.ErrDiskFull)), server.JSStreamStoreFailedF, "database disk full"},
		{"disk full, backend gone", PublishFailed(fmt.Errorf("%w: %w", pg.ErrUnavailable, pg.ErrDiskFull)), server.JSStreamStoreFailedF, "database disk full"},
		{"stream gone", PublishRefused(fmt.Errorf("stream 7: %w", pg.ErrNotFound)), server.JSStreamNotFoundErr, "stream not found"},
		{"wrong last sequence", PublishRefused(&pg.ExpectError{LastSeq: 3}), server.JSStreamWrongLastSequenceErrF, "wrong last sequence: 3"},
		{"wrong last msg id", PublishRefused(&pg.ExpectError{Kind: pg.ExpectLastMsgIDKind, LastID: "a"}), server.JSStreamWrongLastMsgIDErrF, "wrong last msg ID: a"},
		{"discard new", PublishRefused(limit), server.JSStreamStoreFailedF, limit.Error()},
		{"sequence space", PublishRefused(pg.ErrSeqExhausted), server.JSStreamStoreFailedF, pg.ErrSeqExhausted.Error()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.got.ErrCode != uint16(server.ApiErrors[tc.errCode].ErrCode) || tc.got.Description != tc.desc {
				t.Errorf("got %d %q, want %d %q", tc.got.ErrCode, tc.got.Description, server.ApiErrors[tc.errCode].ErrCode, tc.desc)
			}
		})
	}
}

// TestStatusLines checks the status lines a direct get answers with: its own verdicts as
// they are, a database that cannot be reached as the 503 of a stream nobody serves, any
// other failure as a 500.
func TestStatusLines(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		code int
		desc string
	}{
		{"message not found", DirectLookup(fmt.Errorf("get: %w", pg.ErrNotFound)), 404, "Message Not Found"},
		{"too many", TooManyResults, 413, "Too Many Results"},
		{"bad request", BadRequest("Bad Request"), 408, "Bad Request"},
		{"unreachable", fmt.Errorf("read: %w", pg.ErrUnavailable), 503, ""},
		{"request gave up", context.Canceled, 503, ""},
		{"database refused", errors.New("ERROR: division by zero (SQLSTATE 22012)"), 500, "Database Error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := StatusOf(tc.err); got.Code != tc.code || got.Description != tc.desc {
				t.Errorf("StatusOf(%v) = %d %q, want %d %q", tc.err, got.Code, got.Description, tc.code, tc.desc)
			}
		})
	}
}

// TestConsumerErrors checks what consumer requests answer when PostgreSQL refuses them, as
// the engine wraps the refusal: only PostgreSQL's not found is "not found", and what it
// is not found depends on the request.
func TestConsumerErrors(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("consumer %q on stream %q: %w", "C", "S", err) }
	for _, tc := range []struct {
		name    string
		err     error
		code    int
		errCode server.ErrorIdentifier
	}{
		{"lookup: not found", ConsumerLookup(wrap(pg.ErrNotFound)), 404, server.JSConsumerNotFoundErr},
		{"lookup: unreachable", ConsumerLookup(wrap(pg.ErrUnavailable)), 503, server.JSClusterNotAvailErr},
		{"lookup: refused", ConsumerLookup(wrap(errors.New("ERROR: out of memory"))), 500, server.JSConsumerCreateErrF},
		{"create: name held", ConsumerCreate(wrap(pg.ErrExists)), 400, server.JSConsumerNameExistErr},
		{"create: max consumers", ConsumerCreate(wrap(pg.ErrMaxConsumers)), 400, server.JSMaximumConsumersLimitErr},
		{"create: stream gone", ConsumerCreate(wrap(pg.ErrNotFound)), 404, server.JSStreamNotFoundErr},
		{"create: timed out", ConsumerCreate(wrap(pg.ErrTimeout)), 503, server.JSClusterNotAvailErr},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := API(wrap(tc.err), server.NewJSConsumerCreateError)
			if got.Code != tc.code || got.ErrCode != uint16(tc.errCode) {
				t.Errorf("API(%v) = %d/%d %q, want %d/%d", tc.err, got.Code, got.ErrCode, got.Description, tc.code, tc.errCode)
			}
		})
	}
}
