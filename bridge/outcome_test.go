package bridge

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

// outcomeBridge is a bridge whose database is reached through a proxy, with a stream that
// holds one message, so that the publish path's statements are prepared.
func outcomeBridge(t *testing.T, cfg pg.Config) (*testBundle, *pgtest.Proxy, jetstream.Stream) {
	t.Helper()
	proxy := pgtest.NewProxy(t, pgtest.NewDB(t))
	cfg.URL = proxy.URL()
	tb := setup(t, setupOpts{db: pgtest.OpenWith(t, cfg)})
	ctx := testContext(t)
	s, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "OUT", Subjects: []string{"out.>"}})
	if err != nil {
		t.Fatal(err)
	}
	if ack, err := tb.js.Publish(ctx, "out.a", []byte("first")); err != nil || ack.Sequence != 1 {
		t.Fatalf("first publish: %+v, %v", ack, err)
	}
	return tb, proxy, s
}

// expectStream checks that the stream holds msgs messages up to last, the one at seq
// holding data.
func expectStream(t *testing.T, s jetstream.Stream, msgs, last, seq uint64, data string) {
	t.Helper()
	ctx := testContext(t)
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st := info.State; st.Msgs != msgs || st.LastSeq != last {
		t.Fatalf("stream holds %d messages up to %d, want %d up to %d", st.Msgs, st.LastSeq, msgs, last)
	}
	m, err := s.GetMsg(ctx, seq)
	if err != nil {
		t.Fatal(err)
	}
	if string(m.Data) != data {
		t.Fatalf("message %d is %q, want %q", seq, m.Data, data)
	}
}

// A publish whose commit reached PostgreSQL and whose answer was lost with the connection
// is answered with its PubAck once jetgres has read back that it was stored, never with an
// error: a client that took the error for the truth and published again without an id
// would store the message twice. The general path (a publish with Nats-Msg-Id) sends a
// COMMIT; the fast path's one statement commits on its own.
func TestPublishCommitAnswerLost(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		match func(string) bool
		opts  []jetstream.PublishOpt
	}{
		{"general path", func(sql string) bool { return sql == "COMMIT" }, []jetstream.PublishOpt{jetstream.WithMsgID("id-2")}},
		{"fast path", func(sql string) bool { return strings.HasPrefix(sql, "WITH u AS (UPDATE jetgres.stream_state") }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tb, proxy, s := outcomeBridge(t, pg.Config{})
			ctx := testContext(t)
			done := proxy.Arm(pgtest.CutAnswer, tc.match)
			ack, err := tb.js.Publish(ctx, "out.b", []byte("second"), tc.opts...)
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the proxy never cut the publish's commit")
			}
			if err != nil {
				t.Fatalf("publish whose commit reached the database: %v, want its PubAck", err)
			}
			if ack.Sequence != 2 || ack.Duplicate {
				t.Fatalf("PubAck %+v, want sequence 2", ack)
			}
			expectStream(t, s, 2, 2, 2, "second")
			if n := labelCount(t, tb.reg, "jetgres_publish_outcome_unknown_total", "found", "stored"); n != 1 {
				t.Errorf("jetgres_publish_outcome_unknown_total{found=stored} = %v, want 1", n)
			}
			if ack, err := tb.js.Publish(ctx, "out.c", []byte("third")); err != nil || ack.Sequence != 3 {
				t.Fatalf("the next publish: %+v, %v, want sequence 3", ack, err)
			}
			if len(tc.opts) > 0 {
				again, err := tb.js.Publish(ctx, "out.b", []byte("second"), tc.opts...)
				if err != nil || !again.Duplicate || again.Sequence != 2 {
					t.Fatalf("retry with the same id: %+v, %v, want a duplicate of 2", again, err)
				}
			}
		})
	}
}

// A publish whose commit got no answer while the database went away cannot be read back:
// it is left unanswered, never failed, and the client's retry with the same Nats-Msg-Id,
// once the database is back, is answered with the first attempt's sequence.
func TestPublishOutcomeUnknownLeftUnanswered(t *testing.T) {
	t.Parallel()
	tb, proxy, s := outcomeBridge(t, pg.Config{StmtTimeout: 2 * time.Second})
	done := proxy.Arm(pgtest.CutAll, func(sql string) bool { return sql == "COMMIT" })
	ctx, cancel := context.WithTimeout(testContext(t), 6*time.Second)
	defer cancel()
	ack, err := tb.js.Publish(ctx, "out.b", []byte("second"), jetstream.WithMsgID("id-2"))
	<-done
	if _, api := errors.AsType[*jetstream.APIError](err); err == nil || api {
		t.Fatalf("publish whose outcome could not be read back: %+v, %v, want no answer", ack, err)
	}
	if n := labelCount(t, tb.reg, "jetgres_publish_outcome_unknown_total", "found", "unknown"); n != 1 {
		t.Errorf("jetgres_publish_outcome_unknown_total{found=unknown} = %v, want 1", n)
	}
	proxy.Restore()
	again, err := tb.js.Publish(testContext(t), "out.b", []byte("second"), jetstream.WithMsgID("id-2"))
	if err != nil || !again.Duplicate || again.Sequence != 2 {
		t.Fatalf("retry with the same id: %+v, %v, want a duplicate of 2", again, err)
	}
	expectStream(t, s, 2, 2, 2, "second")
}
