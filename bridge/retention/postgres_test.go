package retention

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/internal/clock/clocktest"
	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

// On PostgreSQL, a work queue's acks remove their messages: those at the front move the
// first sequence, one further on is left as a tombstone, and what was not acknowledged
// stays. Then an update's lower max_msgs and max_age apply to what is left.
func TestPassesOnPostgreSQL(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.Open(t)
	s := &fakeStream{name: "WQ", cfg: server.StreamConfig{Name: "WQ", Subjects: []string{"wq.*"},
		Retention: server.WorkQueuePolicy, Storage: server.FileStorage}}
	raw, err := json.Marshal(s.cfg)
	if err != nil {
		t.Fatal(err)
	}
	stored, err := db.CreateStream(ctx, s.name, raw)
	if err != nil {
		t.Fatal(err)
	}
	s.id = stored.ID
	clock := clocktest.New()
	msgs := make([]pg.AppendMsg, 6)
	for i := range msgs {
		msgs[i] = pg.AppendMsg{Subject: "wq.a", Data: []byte{byte(i)}}
	}
	if _, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: s.id, Msgs: msgs}}, clock.Now().UnixNano()); err != nil {
		t.Fatal(err)
	}
	if _, err := db.CreateConsumer(ctx, consumer(t, s.id, "w", 0), 0); err != nil {
		t.Fatal(err)
	}
	host := newHost(s)
	host.serve("w", ConsumerProgress{Floor: 0, Next: 7})
	e, err := New(Config[*fakeStream]{Store: db, Host: host, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	noteAcks(e)
	for _, seq := range []uint64{1, 2, 4} {
		e.NoteAck(s, "w", seq, ack)
	}
	if err := e.Settle(ctx, s); err != nil {
		t.Fatal(err)
	}
	wantEvents(t, host, "purged WQ first=3 consumed=true")
	state := func(step string, msgs, first, deleted uint64) {
		t.Helper()
		st, err := db.StreamInfo(ctx, s.id)
		if err != nil {
			t.Fatal(err)
		}
		if st.Msgs != msgs || st.FirstSeq != first || st.Deleted != deleted {
			t.Fatalf("%s: msgs=%d first=%d deleted=%d, want msgs=%d first=%d deleted=%d",
				step, st.Msgs, st.FirstSeq, st.Deleted, msgs, first, deleted)
		}
	}
	state("after the acks", 3, 3, 1)

	if err := e.ApplyLimits(ctx, s, pg.Limits{MaxMsgs: 2}, 0); err != nil {
		t.Fatal(err)
	}
	wantEvents(t, host, "purged WQ first=0 consumed=false")
	state("after max_msgs", 2, 5, 0)
	clock.Advance(time.Hour)
	if err := e.ApplyLimits(ctx, s, pg.Limits{}, time.Minute); err != nil {
		t.Fatal(err)
	}
	wantEvents(t, host, "purged WQ first=0 consumed=false")
	state("after max_age", 0, 7, 0)
}
