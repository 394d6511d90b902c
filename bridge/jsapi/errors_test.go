package jsapi

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/pg"
)

// TestAPIErrorMapping checks the one mapping from a handler's error to the JetStream error
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
		{"request gave up", context.DeadlineExceeded, 503, server.JSClusterNotAvailErr, "JetStream system temporarily unavailable"},
		{"stream not found", server.NewJSStreamNotFoundError(), 404, server.JSStreamNotFoundErr, "stream not found"},
		{"consumer not found", server.NewJSConsumerNotFoundError(), 404, server.JSConsumerNotFoundErr, "consumer not found"},
		{"database refused", errors.New("ERROR: division by zero (SQLSTATE 22012)"), 500, server.JSConsumerCreateErrF, "database error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := apiError(tc.err, server.NewJSConsumerCreateError)
			if got.Code != tc.code || got.ErrCode != uint16(tc.errCode) || got.Description != tc.desc {
				t.Errorf("apiError(%v) = %d/%d %q, want %d/%d %q", tc.err, got.Code, got.ErrCode, got.Description, tc.code, tc.errCode, tc.desc)
			}
		})
	}
}
