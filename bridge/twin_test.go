package bridge

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/jstwin"
	"github.com/jetgres/jetgres/internal/testwait"
)

// The twin harness runs every operation twice, once against jetgres and once against a
// real nats-server with JetStream (file storage), and compares what clients see: publish
// errors by err_code, and stream state (messages, bytes, first and last sequence,
// num_deleted, consumer count) after each step; compareAll (twin_compare_test.go) compares
// everything else a client can read.

const (
	ours = iota
	theirs
)

var sideName = [2]string{"jetgres", "jetstream"}

// startJetStream starts the reference: an embedded nats-server with JetStream enabled.
func startJetStream(t testing.TB) jetstream.JetStream {
	t.Helper()
	return startJetStreamWith(t, jstwin.Config{})
}

// startJetStreamWith is startJetStream with a configuration of the test's own; StoreDir is
// filled in.
func startJetStreamWith(t testing.TB, cfg jstwin.Config) jetstream.JetStream {
	t.Helper()
	cfg.StoreDir = t.TempDir()
	srv, err := jstwin.Start(cfg)
	if err != nil {
		t.Fatalf("reference server: %v", err)
	}
	t.Cleanup(srv.Stop)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatalf("connect to reference server: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// twin drives jetgres and the reference side by side.
type twin struct {
	t   *testing.T
	ctx context.Context
	tb  *testBundle
	js  [2]jetstream.JetStream
	// What the twin made, for compareAll: stream names, and consumers as stream and name.
	streams []string
	cons    [][2]string
	// exactPending compares the pending token of every delivery, for tests that remove no
	// message a consumer has yet to reach.
	exactPending bool
}

func newTwin(t *testing.T) *twin {
	t.Helper()
	tb := setup(t)
	return &twin{t: t, ctx: testContext(t), tb: tb, js: [2]jetstream.JetStream{tb.js, startJetStream(t)}}
}

// errCode is a JetStream API error's err_code, 0 for no error; any other error fails t.
func errCode(t testing.TB, side int, err error) jetstream.ErrorCode {
	t.Helper()
	if err == nil {
		return 0
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode
	}
	// Some calls wrap the API error's text rather than the error.
	if m := errCodeText.FindStringSubmatch(err.Error()); m != nil {
		n, _ := strconv.Atoi(m[1])
		return jetstream.ErrorCode(n)
	}
	t.Fatalf("%s: %v", sideName[side], err)
	return 0
}

var errCodeText = regexp.MustCompile(`err_code=(\d+)`)

func (tw *twin) createStream(cfg jetstream.StreamConfig) {
	tw.t.Helper()
	for side, js := range tw.js {
		if _, err := js.CreateStream(tw.ctx, cfg); err != nil {
			tw.t.Fatalf("%s: create stream: %v", sideName[side], err)
		}
	}
	tw.streams = append(tw.streams, cfg.Name)
	tw.compareAll("create stream " + cfg.Name)
}

func (tw *twin) updateStream(cfg jetstream.StreamConfig) {
	tw.t.Helper()
	for side, js := range tw.js {
		if _, err := js.UpdateStream(tw.ctx, cfg); err != nil {
			tw.t.Fatalf("%s: update stream: %v", sideName[side], err)
		}
	}
	tw.compareAll("update stream " + cfg.Name)
}

// pub publishes on both sides and checks that both stored it under the same sequence or
// refused it with the same err_code, which it returns.
func (tw *twin) pub(subject string, data []byte) (uint64, jetstream.ErrorCode) {
	tw.t.Helper()
	var seq [2]uint64
	var code [2]jetstream.ErrorCode
	for side, js := range tw.js {
		ack, err := js.Publish(tw.ctx, subject, data)
		if code[side] = errCode(tw.t, side, err); code[side] == 0 {
			seq[side] = ack.Sequence
		}
	}
	if seq[ours] != seq[theirs] || code[ours] != code[theirs] {
		tw.t.Fatalf("publish %s: jetgres seq %d err_code %d, jetstream seq %d err_code %d",
			subject, seq[ours], code[ours], seq[theirs], code[theirs])
	}
	tw.compareAll("publish to " + subject)
	return seq[ours], code[ours]
}

func (tw *twin) pubN(subject string, n int, size int) {
	tw.t.Helper()
	for range n {
		tw.pub(subject, make([]byte, size))
	}
}

// pubAsync publishes msgs on both sides without waiting between them, so that jetgres takes
// them in few transactions, and compares every outcome.
func (tw *twin) pubAsync(subjects []string, size int) {
	tw.t.Helper()
	var outcome [2][]string
	for side, js := range tw.js {
		futures := make([]jetstream.PubAckFuture, len(subjects))
		for i, subj := range subjects {
			f, err := js.PublishAsync(subj, make([]byte, size))
			if err != nil {
				tw.t.Fatalf("%s: publish async: %v", sideName[side], err)
			}
			futures[i] = f
		}
		for _, f := range futures {
			select {
			case ack := <-f.Ok():
				outcome[side] = append(outcome[side], fmt.Sprintf("seq %d", ack.Sequence))
			case err := <-f.Err():
				outcome[side] = append(outcome[side], fmt.Sprintf("err_code %d", errCode(tw.t, side, err)))
			case <-tw.ctx.Done():
				tw.t.Fatalf("%s: publish async: %v", sideName[side], tw.ctx.Err())
			}
		}
	}
	if !slices.Equal(outcome[ours], outcome[theirs]) {
		tw.t.Fatalf("async publish outcomes differ:\njetgres   %v\njetstream %v", outcome[ours], outcome[theirs])
	}
	tw.compareAll("async publish")
}

// state reads both streams' state and fails unless they agree.
func (tw *twin) state(stream string) jetstream.StreamState {
	tw.t.Helper()
	st, err := tw.states(stream)
	if err != nil {
		tw.t.Fatal(err)
	}
	return st[ours]
}

func (tw *twin) states(stream string) ([2]jetstream.StreamState, error) {
	var st [2]jetstream.StreamState
	for side, js := range tw.js {
		s, err := js.Stream(tw.ctx, stream)
		if err != nil {
			return st, fmt.Errorf("%s: stream info: %w", sideName[side], err)
		}
		st[side] = s.CachedInfo().State
	}
	a, b := st[ours], st[theirs]
	if a.Msgs != b.Msgs || a.Bytes != b.Bytes || a.FirstSeq != b.FirstSeq || a.LastSeq != b.LastSeq ||
		a.NumDeleted != b.NumDeleted || a.Consumers != b.Consumers {
		return st, fmt.Errorf("stream %s differs:\njetgres   %s\njetstream %s", stream, brief(a), brief(b))
	}
	return st, nil
}

// settle waits until both sides agree and cond holds, for what both do in the background.
func (tw *twin) settle(stream string, cond func(jetstream.StreamState) bool) jetstream.StreamState {
	tw.t.Helper()
	var st [2]jetstream.StreamState
	testwait.For(tw.t, 10*time.Second, func() error {
		var err error
		if st, err = tw.states(stream); err != nil {
			return err
		}
		if !cond(st[ours]) {
			return fmt.Errorf("state %s", brief(st[ours]))
		}
		return nil
	})
	return st[ours]
}

func brief(s jetstream.StreamState) string {
	return fmt.Sprintf("msgs=%d bytes=%d first=%d last=%d num_deleted=%d consumers=%d",
		s.Msgs, s.Bytes, s.FirstSeq, s.LastSeq, s.NumDeleted, s.Consumers)
}

func (tw *twin) want(stream string, msgs, first, last uint64, deleted int) {
	tw.t.Helper()
	st := tw.state(stream)
	if st.Msgs != msgs || st.FirstSeq != first || st.LastSeq != last || st.NumDeleted != deleted {
		tw.t.Fatalf("state %s, want msgs=%d first=%d last=%d num_deleted=%d", brief(st), msgs, first, last, deleted)
	}
}

func (tw *twin) purge(stream string, opts ...jetstream.StreamPurgeOpt) {
	tw.t.Helper()
	var code [2]jetstream.ErrorCode
	for side, js := range tw.js {
		s, err := js.Stream(tw.ctx, stream)
		if err != nil {
			tw.t.Fatal(err)
		}
		code[side] = errCode(tw.t, side, s.Purge(tw.ctx, opts...))
	}
	if code[ours] != code[theirs] {
		tw.t.Fatalf("purge: jetgres err_code %d, jetstream err_code %d", code[ours], code[theirs])
	}
	tw.compareAll("purge " + stream)
}

func (tw *twin) deleteMsg(stream string, seq uint64) jetstream.ErrorCode {
	tw.t.Helper()
	var code [2]jetstream.ErrorCode
	for side, js := range tw.js {
		s, err := js.Stream(tw.ctx, stream)
		if err != nil {
			tw.t.Fatal(err)
		}
		code[side] = errCode(tw.t, side, s.DeleteMsg(tw.ctx, seq))
	}
	if code[ours] != code[theirs] {
		tw.t.Fatalf("delete %d: jetgres err_code %d, jetstream err_code %d", seq, code[ours], code[theirs])
	}
	tw.compareAll(fmt.Sprintf("delete %d from %s", seq, stream))
	return code[ours]
}

// consumer creates a consumer on both sides; both must succeed or fail with the same code.
func (tw *twin) consumer(stream string, cfg jetstream.ConsumerConfig) ([2]jetstream.Consumer, jetstream.ErrorCode) {
	tw.t.Helper()
	var cons [2]jetstream.Consumer
	var code [2]jetstream.ErrorCode
	for side, js := range tw.js {
		c, err := js.CreateOrUpdateConsumer(tw.ctx, stream, cfg)
		code[side], cons[side] = errCode(tw.t, side, err), c
	}
	if code[ours] != code[theirs] {
		tw.t.Fatalf("create consumer %s: jetgres err_code %d, jetstream err_code %d", cfg.Durable, code[ours], code[theirs])
	}
	if code[ours] == 0 {
		name := cons[theirs].CachedInfo().Name
		if !slices.Contains(tw.cons, [2]string{stream, name}) {
			tw.cons = append(tw.cons, [2]string{stream, name})
		}
		tw.compareAll("create consumer " + name)
	}
	return cons, code[ours]
}

func (tw *twin) deleteConsumer(stream, name string) {
	tw.t.Helper()
	for side, js := range tw.js {
		if err := js.DeleteConsumer(tw.ctx, stream, name); err != nil {
			tw.t.Fatalf("%s: delete consumer: %v", sideName[side], err)
		}
	}
	tw.cons = slices.DeleteFunc(tw.cons, func(c [2]string) bool { return c == [2]string{stream, name} })
	tw.compareAll("delete consumer " + name)
}

// fetch fetches up to n messages on both sides and checks that both delivered the same
// stream sequences.
func (tw *twin) fetch(cons [2]jetstream.Consumer, n int) [2][]jetstream.Msg {
	tw.t.Helper()
	var out [2][]jetstream.Msg
	var seqs [2][]uint64
	var mds [2][]*jetstream.MsgMetadata
	for side, c := range cons {
		batch, err := c.Fetch(n, jetstream.FetchMaxWait(500*time.Millisecond))
		if err != nil {
			tw.t.Fatalf("%s: fetch: %v", sideName[side], err)
		}
		for m := range batch.Messages() {
			md, err := m.Metadata()
			if err != nil {
				tw.t.Fatal(err)
			}
			out[side] = append(out[side], m)
			seqs[side] = append(seqs[side], md.Sequence.Stream)
			mds[side] = append(mds[side], md)
		}
	}
	if !slices.Equal(seqs[ours], seqs[theirs]) {
		tw.t.Fatalf("fetch: jetgres delivered %v, jetstream %v", seqs[ours], seqs[theirs])
	}
	for i := range mds[ours] {
		if d := diffDelivery(mds[ours][i], mds[theirs][i], tw.exactPending); len(d) > 0 {
			tw.t.Fatalf("fetch:\n%s", strings.Join(d, "\n"))
		}
	}
	tw.compareAll("fetch")
	return out
}

// ack acknowledges, on both sides and with a reply, the fetched messages at the given
// stream sequences.
func (tw *twin) ack(msgs [2][]jetstream.Msg, seqs ...uint64) {
	tw.t.Helper()
	for side := range msgs {
		for _, m := range msgs[side] {
			md, _ := m.Metadata()
			if !slices.Contains(seqs, md.Sequence.Stream) {
				continue
			}
			if err := m.DoubleAck(tw.ctx); err != nil {
				tw.t.Fatalf("%s: ack %d: %v", sideName[side], md.Sequence.Stream, err)
			}
		}
	}
	tw.compareAll(fmt.Sprintf("ack %v", seqs))
}

const errStoreFailed = jetstream.ErrorCode(10077)
