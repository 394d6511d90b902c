package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// backupTimeout bounds one backup or restore through the CLI.
const backupTimeout = 5 * time.Minute

// backupMsgs is how many messages the round trip moves: JETGRES_BACKUP_MSGS, 20,000 by
// default, which is several archive chunks and light enough for CI's shared cores (the
// JetStream side of a 100,000-message restore timed out under load there); the benchmark
// moves a million.
func backupMsgs(t *testing.T) int {
	if v := os.Getenv("JETGRES_BACKUP_MSGS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 100 {
			t.Fatalf("JETGRES_BACKUP_MSGS=%q: want a number of at least 100", v)
		}
		return n
	}
	return 20_000
}

// natsLong runs the nats CLI against s with a bound fit for moving a whole stream.
func natsLong(t *testing.T, s natsServer, args ...string) string {
	t.Helper()
	natsCLI(t)
	ctx, cancel := context.WithTimeout(context.Background(), backupTimeout)
	defer cancel()
	start := time.Now()
	out, err := natsCmdAt(t, ctx, s.url, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: nats %s: %v after %v\n%s", s.name, strings.Join(args, " "), err, time.Since(start).Round(time.Millisecond), out)
	}
	t.Logf("%s: nats %s: %v", s.name, strings.Join(args, " "), time.Since(start).Round(time.Millisecond))
	return string(out)
}

// TestBackupRestoreRoundTrip takes a stream and a key-value bucket around with the nats CLI:
// `nats backup stream` from a real JetStream, `nats backup restore stream` into jetgres,
// a backup from jetgres, and a restore into a second JetStream. At each step the copy holds
// the same messages as the original, compared one by one (sequence, subject, headers,
// payload, store time), with the same interior deletes and state, and its durable
// consumers keep their ack floors. The backup jetgres took also passes `nats backup
// validate`.
func TestBackupRestoreRoundTrip(t *testing.T) {
	t.Parallel()
	n := backupMsgs(t)
	src, mid, dst := startJetStream(t), natsServer{name: "jetgres", url: startWithDatabase(t, testDatabase(t)).natsURL}, startJetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	js := jsAt(t, src.url)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	fill(t, ctx, js, n)
	// Interior deletes, and the first message gone too.
	orders, err := js.Stream(ctx, "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= uint64(n); seq += 97 {
		if err := orders.DeleteMsg(ctx, seq); err != nil {
			t.Fatalf("delete %d: %v", seq, err)
		}
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "CFG", History: 3})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 300 {
		if _, err := kv.Put(ctx, fmt.Sprintf("k%d", i%40), fmt.Appendf(nil, "v%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 5 {
		if err := kv.Delete(ctx, fmt.Sprintf("k%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	// A durable consumer with acks pending past its floor, and one acked through 500.
	ackSome(t, ctx, js, "P", 50, func(i int) bool { return i < 30 || i%3 == 0 })
	ackSome(t, ctx, js, "Q", 500, func(int) bool { return true })

	dir := t.TempDir()
	for _, stream := range []string{"ORDERS", "KV_CFG"} {
		fromSrc, fromMid := filepath.Join(dir, "src-"+stream), filepath.Join(dir, "mid-"+stream)
		natsLong(t, src, "backup", "stream", stream, fromSrc, "--no-progress")
		natsLong(t, mid, "backup", "restore", "stream", fromSrc, "--no-progress")
		sameStream(t, ctx, src, mid, stream)

		natsLong(t, mid, "backup", "stream", stream, fromMid, "--no-progress")
		natsLong(t, mid, "backup", "validate", fromMid, "--no-progress")
		natsLong(t, dst, "backup", "restore", "stream", fromMid, "--no-progress")
		sameStream(t, ctx, src, dst, stream)
	}
	for _, s := range []natsServer{mid, dst} {
		sameConsumer(t, ctx, src, s, "ORDERS", "P")
		sameConsumer(t, ctx, src, s, "ORDERS", "Q")
		kv, err := jsAt(t, s.url).KeyValue(ctx, "CFG")
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		e, err := kv.Get(ctx, "k39")
		if err != nil || string(e.Value()) != "v279" {
			t.Fatalf("%s: k39 = %v, %v", s.name, e, err)
		}
		if _, err := kv.Get(ctx, "k1"); err != jetstream.ErrKeyNotFound {
			t.Fatalf("%s: deleted key k1: %v", s.name, err)
		}
	}
	// The restored stream takes publishes again, after the backup's last sequence.
	ack, err := jsAt(t, mid.url).Publish(ctx, "orders.after", []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	info, err := jsAt(t, src.url).Stream(ctx, "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	if ack.Sequence != info.CachedInfo().State.LastSeq+1 {
		t.Fatalf("publish after restore took %d, want %d", ack.Sequence, info.CachedInfo().State.LastSeq+1)
	}
}

func jsAt(t *testing.T, url string) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(connectURL(t, url))
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// fill publishes n messages, every fifth with headers, each with a payload of its own.
func fill(t *testing.T, ctx context.Context, js jetstream.JetStream, n int) {
	t.Helper()
	var futures []jetstream.PubAckFuture
	settle := func() {
		select {
		case <-js.PublishAsyncComplete():
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				t.Fatal(err)
			}
		}
		futures = futures[:0]
	}
	for i := range n {
		m := nats.NewMsg(fmt.Sprintf("orders.%d", i%17))
		m.Data = fmt.Appendf(nil, "order %d %s", i, strings.Repeat("x", i%64))
		if i%5 == 0 {
			m.Header.Set("Order-Id", strconv.Itoa(i))
			m.Header.Add("Tag", "a")
			m.Header.Add("Tag", "b")
		}
		f, err := js.PublishMsgAsync(m)
		if err != nil {
			t.Fatal(err)
		}
		if futures = append(futures, f); len(futures) == publishWindow {
			settle()
		}
	}
	settle()
}

// ackSome creates a durable pull consumer, fetches n messages and acks those ack selects.
func ackSome(t *testing.T, ctx context.Context, js jetstream.JetStream, name string, n int, ack func(i int) bool) {
	t.Helper()
	c, err := js.CreateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{Durable: name, AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 10_000})
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for got < n {
		batch, err := c.Fetch(n-got, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			if ack(got) {
				if err := m.DoubleAck(ctx); err != nil {
					t.Fatal(err)
				}
			}
			got++
		}
		if err := batch.Error(); err != nil {
			t.Fatal(err)
		}
	}
}

// sameStream compares stream's state on two servers, and its messages one by one.
func sameStream(t *testing.T, ctx context.Context, a, b natsServer, stream string) {
	t.Helper()
	var infos [2]*jetstream.StreamInfo
	var cons [2]jetstream.Consumer
	for i, s := range []natsServer{a, b} {
		st, err := jsAt(t, s.url).Stream(ctx, stream)
		if err != nil {
			t.Fatalf("%s: %s: %v", s.name, stream, err)
		}
		infos[i] = st.CachedInfo()
		if cons[i], err = st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{}); err != nil {
			t.Fatal(err)
		}
	}
	wa, wb := infos[0].State, infos[1].State
	if wa.Msgs != wb.Msgs || wa.Bytes != wb.Bytes || wa.FirstSeq != wb.FirstSeq || wa.LastSeq != wb.LastSeq ||
		wa.NumDeleted != wb.NumDeleted || !wa.FirstTime.Equal(wb.FirstTime) || !wa.LastTime.Equal(wb.LastTime) {
		t.Fatalf("%s state differs:\n%s: %+v\n%s: %+v", stream, a.name, wa, b.name, wb)
	}
	ca, err := cons[0].Messages()
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Stop()
	cb, err := cons[1].Messages()
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Stop()
	for i := uint64(0); i < wa.Msgs; i++ {
		ma, err := ca.Next()
		if err != nil {
			t.Fatalf("%s: %s message %d: %v", a.name, stream, i, err)
		}
		mb, err := cb.Next()
		if err != nil {
			t.Fatalf("%s: %s message %d: %v", b.name, stream, i, err)
		}
		da, _ := ma.Metadata()
		db, _ := mb.Metadata()
		if da.Sequence.Stream != db.Sequence.Stream || !da.Timestamp.Equal(db.Timestamp) || ma.Subject() != mb.Subject() ||
			!bytes.Equal(ma.Data(), mb.Data()) || fmt.Sprint(ma.Headers()) != fmt.Sprint(mb.Headers()) {
			t.Fatalf("%s message %d differs:\n%s: %d %v %s %v %q\n%s: %d %v %s %v %q", stream, i,
				a.name, da.Sequence.Stream, da.Timestamp, ma.Subject(), ma.Headers(), ma.Data(),
				b.name, db.Sequence.Stream, db.Timestamp, mb.Subject(), mb.Headers(), mb.Data())
		}
	}
}

// sameConsumer compares a durable consumer's positions on the original and on a copy: the
// same ack floor, and what was delivered past it delivered again (pending acks are not
// carried over) or, with nothing pending, the same delivered position.
func sameConsumer(t *testing.T, ctx context.Context, orig, cp natsServer, stream, name string) {
	t.Helper()
	get := func(s natsServer) *jetstream.ConsumerInfo {
		c, err := jsAt(t, s.url).Consumer(ctx, stream, name)
		if err != nil {
			t.Fatalf("%s: consumer %s: %v", s.name, name, err)
		}
		return c.CachedInfo()
	}
	o, c := get(orig), get(cp)
	if o.AckFloor.Consumer != c.AckFloor.Consumer || o.AckFloor.Stream != c.AckFloor.Stream {
		t.Fatalf("%s: consumer %s ack floor %+v, original %+v", cp.name, name, c.AckFloor, o.AckFloor)
	}
	wantDelivered := o.Delivered
	if o.NumAckPending > 0 {
		wantDelivered = o.AckFloor
	}
	if c.Delivered.Consumer != wantDelivered.Consumer || c.Delivered.Stream != wantDelivered.Stream || c.NumAckPending != 0 {
		t.Fatalf("%s: consumer %s delivered %+v with %d pending, want %+v", cp.name, name, c.Delivered, c.NumAckPending, wantDelivered)
	}
	if c.Config.AckPolicy != o.Config.AckPolicy || c.Config.Durable != name {
		t.Fatalf("%s: consumer %s config %+v, original %+v", cp.name, name, c.Config, o.Config)
	}
}
