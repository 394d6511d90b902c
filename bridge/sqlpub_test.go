package bridge

import (
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/bridge/stream"
	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// The tests here need a whole bridge: what the SQL mover does alone is tested in
// bridge/sqlmove.

// A waiting pull consumer gets a committed transaction's message, and never a rolled-back
// one's.
func TestSQLPublishCommitDeliveredRollbackNever(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	s := newStream(t, ctx, tb, "ORDERS", "orders.>")
	cons, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	raw := rawsql.Open(t, tb.dbURL)
	if err := raw.Exec(ctx, `CREATE TABLE orders (id bigint PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	got := make(chan jetstream.Msg, 10)
	cc, err := cons.Consume(func(m jetstream.Msg) { got <- m; _ = m.Ack() })
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	raw.AppTx(t, ctx, false, func(q rawsql.Runner) error {
		if err := q.Exec(ctx, `INSERT INTO orders VALUES (1)`); err != nil {
			return err
		}
		return rawsql.Publish(ctx, q, "orders.created", "rolled back", "")
	})
	raw.AppTx(t, ctx, true, func(q rawsql.Runner) error {
		if err := q.Exec(ctx, `INSERT INTO orders VALUES (2)`); err != nil {
			return err
		}
		return rawsql.Publish(ctx, q, "orders.created", "committed", `{"Order": "2"}`)
	})
	select {
	case m := <-got:
		if string(m.Data()) != "committed" || m.Headers().Get("Order") != "2" {
			t.Fatalf("got %q with headers %v, want the committed message", m.Data(), m.Headers())
		}
		if md, _ := m.Metadata(); md.Sequence.Stream != 1 {
			t.Fatalf("stream sequence %d, want 1", md.Sequence.Stream)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the committed message never came")
	}
	// Nothing else is on its way: the stream holds the one message.
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Fatalf("stream holds %d messages, want 1", info.State.Msgs)
	}
}

// Nats-Msg-Id de-duplicates SQL publishes against NATS publishes and each other, and a
// message its stream refuses at the move is counted.
func TestSQLPublishDedupSharedWithNATS(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	s, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Duplicates: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	raw := rawsql.Open(t, tb.dbURL)
	if _, err := tb.js.Publish(ctx, "s.a", []byte("nats x"), jetstream.WithMsgID("x")); err != nil {
		t.Fatal(err)
	}
	raw.AppTx(t, ctx, true, func(q rawsql.Runner) error {
		if err := rawsql.Publish(ctx, q, "s.a", "sql x", `{"Nats-Msg-Id": "x"}`); err != nil {
			return err
		}
		return rawsql.Publish(ctx, q, "s.a", "sql y", `{"Nats-Msg-Id": "y"}`)
	})
	raw.AppTx(t, ctx, true, func(q rawsql.Runner) error {
		return rawsql.Publish(ctx, q, "s.a", "sql y again", `{"Nats-Msg-Id": "y"}`)
	})
	testwait.For(t, 10*time.Second, func() error {
		info, err := s.Info(ctx)
		if err != nil {
			return err
		}
		if info.State.Msgs != 2 {
			return fmt.Errorf("stream holds %d messages, want 2", info.State.Msgs)
		}
		return nil
	})
	ack, err := tb.js.Publish(ctx, "s.a", []byte("nats y"), jetstream.WithMsgID("y"))
	if err != nil {
		t.Fatal(err)
	}
	if !ack.Duplicate || ack.Sequence != 2 {
		t.Fatalf("NATS publish of y: %+v, want a duplicate of sequence 2", ack)
	}
	testwait.For(t, 10*time.Second, func() error {
		if n := reasonCount(t, tb.reg, "jetgres_sql_publish_refused_total", stream.ReasonDuplicate); n != 2 {
			return fmt.Errorf("refused duplicates counted %v, want 2", n)
		}
		return nil
	})
	m, err := s.GetMsg(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if string(m.Data) != "sql y" {
		t.Fatalf("sequence 2 is %q, want the first SQL publish of y", m.Data)
	}
}

// jetgres.messages returns exactly what a consumer with deliver policy all receives, after
// limits, deletes and purges.
func TestSQLMessagesMatchDeliverAll(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	s, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"},
		MaxMsgs: 60, MaxMsgsPerSubject: 8})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 150 {
		hdr := nats.Header{"N": []string{strconv.Itoa(i)}, "Two": []string{"a", "b"}}
		if _, err := tb.js.PublishMsg(ctx, &nats.Msg{Subject: fmt.Sprintf("s.%d", i%9), Data: []byte(strconv.Itoa(i)), Header: hdr}); err != nil {
			t.Fatal(err)
		}
	}
	for _, seq := range []uint64{145, 147, 149} {
		if err := s.DeleteMsg(ctx, seq); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Purge(ctx, jetstream.WithPurgeSubject("s.3")); err != nil {
		t.Fatal(err)
	}
	oc, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for range info.State.Msgs {
		m, err := oc.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		md, _ := m.Metadata()
		want = append(want, fmt.Sprintf("%d %s %s %s %v", md.Sequence.Stream, m.Subject(), m.Data(), m.Headers().Get("N"), m.Headers().Values("Two")))
	}
	raw := rawsql.Open(t, tb.dbURL)
	rows, err := raw.Query(ctx, `SELECT seq, subject, convert_from(data, 'UTF8'), headers->'N'->>0,
		ARRAY(SELECT jsonb_array_elements_text(headers->'Two')) FROM jetgres.messages('S')`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var seq int64
		var subj, data, n string
		var two []string
		if err := rows.Scan(&seq, &subj, &data, &n, &two); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%d %s %s %s %v", seq, subj, data, n, two))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(want) == 0 || !slices.Equal(got, want) {
		t.Fatalf("jetgres.messages:\n%v\ndeliver all:\n%v", got, want)
	}
	from := raw.Strings(t, `SELECT seq::text FROM jetgres.messages('S', 140, 's.5')`)
	if !slices.Equal(from, []string{"141", "150"}) {
		t.Fatalf("s.5 from 140: %v, want [141 150]", from)
	}
}
