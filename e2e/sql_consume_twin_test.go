package e2e

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/jstwin"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// sqlTwinInfo is the part of consumer info that reading in SQL must report as JetStream
// reports it for the equivalent deliveries and acks over NATS.
type sqlTwinInfo struct {
	Delivered, AckFloor    [2]uint64 // consumer and stream sequences
	NumAckPending          int
	NumRedelivered         int
	NumPending             uint64
	LastDelivered, LastAck bool // whether set
}

func sqlTwinInfoOf(info *jetstream.ConsumerInfo) sqlTwinInfo {
	return sqlTwinInfo{
		Delivered: [2]uint64{info.Delivered.Consumer, info.Delivered.Stream}, AckFloor: [2]uint64{info.AckFloor.Consumer, info.AckFloor.Stream},
		NumAckPending: info.NumAckPending, NumRedelivered: info.NumRedelivered, NumPending: info.NumPending,
		LastDelivered: info.Delivered.Last != nil, LastAck: info.AckFloor.Last != nil,
	}
}

// sqlTwinSetup makes stream ORDERS with ten messages, orders.a.<i> and orders.b.<i> in
// turn, and consumer C of orders.a.>.
func sqlTwinSetup(ctx context.Context, t *testing.T, js jetstream.JetStream) {
	t.Helper()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 10; i++ {
		subj := fmt.Sprintf("orders.%c.%d", "ba"[i%2], i)
		if _, err := js.Publish(ctx, subj, []byte(subj)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := js.CreateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckExplicitPolicy,
		FilterSubject: "orders.a.>", AckWait: time.Hour}); err != nil {
		t.Fatal(err)
	}
}

// TestSQLConsumeInfoTwin compares consumer info after the same deliveries and acks: over
// NATS on JetStream (a NAK where SQL rolls back), in SQL on jetgres. Messages 1, 3 and 5
// match the filter: 1 and 3 are delivered and NAKed (rolled back), then 1, 3 and 5
// delivered again and only 1 acked.
func TestSQLConsumeInfoTwin(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	twin, err := jstwin.Start(jstwin.Config{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(twin.Stop)
	nc, err := nats.Connect(twin.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	sqlTwinSetup(ctx, t, js)
	c, err := js.Consumer(ctx, "ORDERS", "C")
	if err != nil {
		t.Fatal(err)
	}
	fetch := func(n int) []jetstream.Msg {
		b, err := c.FetchNoWait(n)
		if err != nil {
			t.Fatal(err)
		}
		var out []jetstream.Msg
		for m := range b.Messages() {
			out = append(out, m)
		}
		if len(out) != n {
			t.Fatalf("fetched %d of %d", len(out), n)
		}
		return out
	}
	for _, m := range fetch(2) {
		if err := m.Nak(); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := fetch(3)[0].DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	wantInfo, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := sqlTwinInfoOf(wantInfo)

	dsn := testDatabase(t)
	j := startWithDatabase(t, dsn)
	_, gjs := j.connect(t)
	sqlTwinSetup(ctx, t, gjs)
	probe := openProbe(t, dsn, 2)
	if err := probe.Exec(ctx, `SELECT jetgres.read_in_sql('ORDERS', 'C')`); err != nil {
		t.Fatal(err)
	}
	tx := func(commit bool, fn func(q rawsql.Runner) error) error {
		errRollback := errors.New("rollback")
		err := probe.Tx(ctx, func(ctx context.Context, q rawsql.Runner) error {
			if err := fn(q); err != nil {
				return err
			}
			if !commit {
				return errRollback
			}
			return nil
		})
		if errors.Is(err, errRollback) {
			return nil
		}
		return err
	}
	sqlNext := func(q rawsql.Runner, n int) error {
		var got int
		if err := q.QueryRow(ctx, `SELECT count(*) FROM jetgres.next('ORDERS', 'C', $1)`, n).Scan(&got); err != nil {
			return err
		}
		if got != n {
			return fmt.Errorf("jetgres.next returned %d of %d", got, n)
		}
		return nil
	}
	// The replica that created C lets it go once it hears of the switch: until then
	// jetgres.next refuses with JG012.
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := tx(false, func(q rawsql.Runner) error { return sqlNext(q, 2) })
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
	}
	if err := tx(true, func(q rawsql.Runner) error {
		if err := sqlNext(q, 3); err != nil {
			return err
		}
		return q.Exec(ctx, `SELECT jetgres.ack('ORDERS', 'C', 1)`)
	}); err != nil {
		t.Fatal(err)
	}
	gc, err := gjs.Consumer(ctx, "ORDERS", "C")
	if err != nil {
		t.Fatal(err)
	}
	// The ack floor's consumer sequence is the one thing left out: JetStream's is the first
	// delivery sequence of the lowest message still pending, less one, and jetgres keeps no
	// delivery sequence per message; it reports every delivery but those of the messages
	// above the floor, which agrees while nothing was delivered twice.
	got := sqlTwinInfoOf(gc.CachedInfo())
	got.AckFloor[0], want.AckFloor[0] = 0, 0
	if got != want {
		t.Fatalf("consumer info after reading in SQL:\n got %+v\nwant %+v (JetStream)", got, want)
	}
	// NATS loses while SQL reads it: a pull is refused, it delivers nothing.
	b, err := gc.Fetch(1, jetstream.FetchMaxWait(2*time.Second))
	if err == nil {
		for m := range b.Messages() {
			t.Errorf("a pull got message %s of a consumer read in SQL", m.Subject())
		}
		err = b.Error()
	}
	if err == nil || !strings.Contains(err.Error(), "Read In SQL") {
		t.Errorf("a pull of a consumer read in SQL: %v, want refused as read in SQL", err)
	}
}
