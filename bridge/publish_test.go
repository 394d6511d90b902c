package bridge

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestPublishAsyncDenseSequences(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	if _, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}); err != nil {
		t.Fatal(err)
	}
	const n = 100_000
	futures := make([]jetstream.PubAckFuture, 0, n)
	for i := range n {
		f, err := tb.js.PublishAsync("orders.new", []byte(strconv.Itoa(i)), jetstream.WithStallWait(30*time.Second))
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		futures = append(futures, f)
	}
	select {
	case <-tb.js.PublishAsyncComplete():
	case <-time.After(60 * time.Second):
		t.Fatalf("acks pending: %d", tb.js.PublishAsyncPending())
	}
	seen := make([]bool, n+1)
	for i, f := range futures {
		select {
		case ack := <-f.Ok():
			if ack.Stream != "ORDERS" || ack.Sequence < 1 || ack.Sequence > n || seen[ack.Sequence] {
				t.Fatalf("publish %d: bad ack %+v", i, ack)
			}
			seen[ack.Sequence] = true
		case err := <-f.Err():
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	info, err := tb.js.Stream(ctx, "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	st := info.CachedInfo().State
	if st.Msgs != n || st.FirstSeq != 1 || st.LastSeq != n {
		t.Fatalf("state = %+v", st)
	}
}

func TestPublishDedupAndExpectations(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	if _, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.*"}}); err != nil {
		t.Fatal(err)
	}
	a1, err := tb.js.Publish(ctx, "s.a", []byte("1"), jetstream.WithMsgID("id-1"))
	if err != nil || a1.Sequence != 1 || a1.Duplicate {
		t.Fatalf("first: %+v %v", a1, err)
	}
	a2, err := tb.js.Publish(ctx, "s.a", []byte("1"), jetstream.WithMsgID("id-1"))
	if err != nil || a2.Sequence != 1 || !a2.Duplicate {
		t.Fatalf("duplicate: %+v %v", a2, err)
	}
	if _, err := tb.js.Publish(ctx, "s.b", []byte("2"), jetstream.WithExpectLastSequence(1)); err != nil {
		t.Fatalf("expect last seq 1: %v", err)
	}
	checkCode := func(err error, code jetstream.ErrorCode) {
		t.Helper()
		var apiErr *jetstream.APIError
		if !errors.As(err, &apiErr) || apiErr.ErrorCode != code {
			t.Fatalf("want err_code %d, got %v", code, err)
		}
	}
	_, err = tb.js.Publish(ctx, "s.b", []byte("3"), jetstream.WithExpectLastSequence(1))
	checkCode(err, jetstream.JSErrCodeStreamWrongLastSequence)
	_, err = tb.js.Publish(ctx, "s.b", []byte("3"), jetstream.WithExpectStream("OTHER"))
	checkCode(err, jetstream.ErrorCode(10060))
	_, err = tb.js.Publish(ctx, "s.b", []byte("3"), jetstream.WithExpectLastMsgID("nope"))
	checkCode(err, jetstream.ErrorCode(10070))
	if _, err := tb.js.Publish(ctx, "s.a", []byte("3"), jetstream.WithExpectLastSequencePerSubject(1)); err != nil {
		t.Fatalf("expect last subject seq: %v", err)
	}
	_, err = tb.js.Publish(ctx, "s.a", []byte("4"), jetstream.WithExpectLastSequencePerSubject(1))
	checkCode(err, jetstream.JSErrCodeStreamWrongLastSequence)
	if _, err := tb.js.Publish(ctx, "s.c", []byte("5"), jetstream.WithMsgID("id-5"), jetstream.WithExpectLastMsgID("")); err != nil {
		t.Fatal(err)
	}
	if _, err := tb.js.Publish(ctx, "s.c", []byte("6"), jetstream.WithExpectLastMsgID("id-5")); err != nil {
		t.Fatalf("expect last msg id: %v", err)
	}
}

func TestPublishTooLarge(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	if _, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "SMALL", Subjects: []string{"small"}, MaxMsgSize: 16}); err != nil {
		t.Fatal(err)
	}
	_, err := tb.js.Publish(ctx, "small", make([]byte, 17))
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamMessageExceedsMaximum {
		t.Fatalf("want 10054, got %v", err)
	}
	if _, err := tb.js.Publish(ctx, "small", make([]byte, 16)); err != nil {
		t.Fatal(err)
	}
}

func TestPublishSurvivesRestart(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	if _, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "R", Subjects: []string{"r"}}); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := tb.js.Publish(ctx, "r", nil, jetstream.WithMsgID(fmt.Sprint("m", i))); err != nil {
			t.Fatal(err)
		}
	}
	db := tb.db
	tb.stop(t)
	tb2 := setup(t, setupOpts{db: db})
	ack, err := tb2.js.Publish(ctx, "r", nil, jetstream.WithMsgID("m4"))
	if err != nil || !ack.Duplicate || ack.Sequence != 5 {
		t.Fatalf("dedup after restart: %+v %v", ack, err)
	}
	ack, err = tb2.js.Publish(ctx, "r", nil)
	if err != nil || ack.Sequence != 6 {
		t.Fatalf("sequence after restart: %+v %v", ack, err)
	}
}

func TestConcurrentPublishersThreeStreams(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	for _, name := range []string{"A", "B", "C"} {
		if _, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}}); err != nil {
			t.Fatal(err)
		}
	}
	const perPublisher = 500
	var wg sync.WaitGroup
	errs := make(chan error, 12)
	for p := range 12 {
		subj := []string{"A", "B", "C"}[p%3] + ".x"
		wg.Go(func() {
			nc, err := nats.Connect(tb.nats.ClientURL())
			if err != nil {
				errs <- err
				return
			}
			defer nc.Close()
			js, _ := jetstream.New(nc)
			for range perPublisher {
				if _, err := js.Publish(ctx, subj, []byte("x")); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, name := range []string{"A", "B", "C"} {
		s, err := tb.js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		st := s.CachedInfo().State
		if st.Msgs != 4*perPublisher || st.LastSeq != 4*perPublisher {
			t.Fatalf("%s: %+v", name, st)
		}
	}
}

func TestStreamAdmin(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	s, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "ADM", Subjects: []string{"adm.>"}})
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	if cfg.Duplicates != 2*time.Minute || cfg.MaxMsgs != -1 || cfg.Storage != jetstream.FileStorage || cfg.Replicas != 1 {
		t.Fatalf("defaults not filled in: %+v", cfg)
	}
	// Same config again succeeds; a different one is refused.
	if _, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "ADM", Subjects: []string{"adm.>"}}); err != nil {
		t.Fatalf("idempotent create: %v", err)
	}
	if _, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "ADM", Subjects: []string{"other"}}); !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		t.Fatalf("want name in use, got %v", err)
	}
	var apiErr *jetstream.APIError
	_, err = tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "OVER", Subjects: []string{"adm.x"}})
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.ErrorCode(10065) {
		t.Fatalf("want overlap, got %v", err)
	}
	for _, bad := range []string{"a.b", "a b", "a*", "a>"} {
		if _, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: bad, Subjects: []string{"bad"}}); err == nil {
			t.Fatalf("name %q accepted", bad)
		}
	}
	// Names that are unsafe as SQL identifiers are stored safely.
	for _, odd := range []string{`q"uote`, `x');DROP_TABLE_jetgres_streams;--`, "ünïcode"} {
		subj := fmt.Sprintf("odd%d", len(odd))
		st, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: odd, Subjects: []string{subj}})
		if err != nil {
			t.Fatalf("create %q: %v", odd, err)
		}
		if _, err := tb.js.Publish(ctx, subj, []byte("v")); err != nil {
			t.Fatalf("publish to %q: %v", odd, err)
		}
		msg, err := st.GetMsg(ctx, 1)
		if err != nil || string(msg.Data) != "v" {
			t.Fatalf("get from %q: %v", odd, err)
		}
	}
	for i := range 10 {
		if _, err := tb.js.Publish(ctx, "adm."+strconv.Itoa(i%2), []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	last, err := s.GetLastMsgForSubject(ctx, "adm.0")
	if err != nil || last.Sequence != 9 {
		t.Fatalf("last by subject: %+v %v", last, err)
	}
	if err := s.DeleteMsg(ctx, 5); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetMsg(ctx, 5); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("deleted message still there: %v", err)
	}
	info, err := s.Info(ctx)
	if err != nil || info.State.Msgs != 9 || info.State.NumDeleted != 1 {
		t.Fatalf("after delete: %+v %v", info.State, err)
	}
	names := tb.js.StreamNames(ctx)
	count := 0
	for range names.Name() {
		count++
	}
	if names.Err() != nil || count != 4 {
		t.Fatalf("names: %d %v", count, names.Err())
	}
	if err := s.Purge(ctx, jetstream.WithPurgeSubject("adm.1")); err != nil {
		t.Fatal(err)
	}
	info, _ = s.Info(ctx)
	if info.State.Msgs != 4 {
		t.Fatalf("after filtered purge: %+v", info.State)
	}
	if err := s.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	info, _ = s.Info(ctx)
	if info.State.Msgs != 0 || info.State.LastSeq != 10 || info.State.FirstSeq != 11 {
		t.Fatalf("after purge: %+v", info.State)
	}
	if err := tb.js.DeleteStream(ctx, "ADM"); err != nil {
		t.Fatal(err)
	}
	if _, err := tb.js.Stream(ctx, "ADM"); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("want not found, got %v", err)
	}
	if _, err := tb.js.Publish(ctx, "adm.1", nil, jetstream.WithRetryAttempts(0)); !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Fatalf("publish to deleted stream: %v", err)
	}
}

func TestMalformedAPIRequests(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	for _, subj := range []string{"$JS.API.STREAM.CREATE.X", "$JS.API.STREAM.UPDATE.X", "$JS.API.STREAM.PURGE.X", "$JS.API.STREAM.MSG.GET.X", "$JS.API.STREAM.NAMES"} {
		resp, err := tb.nc.Request(subj, []byte(`{"name":`), 5*time.Second)
		if err != nil {
			t.Fatalf("%s: %v", subj, err)
		}
		if !bytes.Contains(resp.Data, []byte(`"err_code":10025`)) || !bytes.Contains(resp.Data, []byte(`"type":"io.nats.jetstream.api.v1.`)) {
			t.Fatalf("%s: %s", subj, resp.Data)
		}
	}
	resp, err := tb.nc.Request("$JS.API.STREAM.INFO.NOPE", nil, 5*time.Second)
	if err != nil || !bytes.Contains(resp.Data, []byte(`"err_code":10059`)) {
		t.Fatalf("unknown stream: %s %v", resp.Data, err)
	}
}
