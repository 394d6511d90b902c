package bridge

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/bridge/stream"
	"github.com/jetgres/jetgres/internal/jswire"
	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg"
)

// Sequences at the edges of what jetgres stores (see pg.MaxSeq), as raw requests.
const (
	seqMax     = pg.MaxSeq     // 2^63-2, the largest sequence a message takes
	seqInt64   = pg.MaxSeq + 1 // 2^63-1, bigint's largest
	seqTopBit  = uint64(1) << 63
	seqUintMax = ^uint64(0)
)

func TestSeqLimitAgreesAcrossPackages(t *testing.T) {
	if jswire.MaxSeq != pg.MaxSeq {
		t.Fatalf("jswire.MaxSeq %d, pg.MaxSeq %d", jswire.MaxSeq, pg.MaxSeq)
	}
}

// rawPub publishes with headers and returns the PubAck's sequence or its error.
func rawPub(t *testing.T, nc *nats.Conn, subject string, hdr ...string) (uint64, *server.ApiError) {
	t.Helper()
	m := nats.NewMsg(subject)
	m.Data = []byte("x")
	for i := 0; i+1 < len(hdr); i += 2 {
		m.Header.Set(hdr[i], hdr[i+1])
	}
	r, err := nc.RequestMsg(m, 5*time.Second)
	if err != nil {
		t.Fatalf("publish to %s: %v", subject, err)
	}
	var a server.JSPubAckResponse
	if err := json.Unmarshal(r.Data, &a); err != nil {
		t.Fatalf("publish to %s: %q: %v", subject, r.Data, err)
	}
	if a.Error != nil {
		return 0, a.Error
	}
	if a.PubAck == nil {
		t.Fatalf("publish to %s: %q", subject, r.Data)
	}
	return a.Sequence, nil
}

// streamState reads a stream's state with a raw STREAM.INFO request.
func streamState(t *testing.T, nc *nats.Conn, name string) server.StreamState {
	t.Helper()
	m, err := nc.Request("$JS.API.STREAM.INFO."+name, nil, 5*time.Second)
	if err != nil {
		t.Fatalf("stream info %s: %v", name, err)
	}
	var r server.JSApiStreamInfoResponse
	if err := json.Unmarshal(m.Data, &r); err != nil || r.Error != nil || r.StreamInfo == nil {
		t.Fatalf("stream info %s: %s (%v)", name, m.Data, err)
	}
	return r.State
}

// apiAnswer describes an API reply for comparison: its error code and description, or the
// message a get found.
func apiAnswer(t *testing.T, nc *nats.Conn, subject, body string) string {
	t.Helper()
	m, err := nc.Request(subject, []byte(body), 5*time.Second)
	if err != nil {
		t.Fatalf("%s %s: %v", subject, body, err)
	}
	var r struct {
		Error   *server.ApiError `json:"error"`
		Success bool             `json:"success"`
		Purged  uint64           `json:"purged"`
		Message *struct {
			Subject  string `json:"subject"`
			Sequence uint64 `json:"seq"`
			Data     []byte `json:"data"`
		} `json:"message"`
	}
	if err := json.Unmarshal(m.Data, &r); err != nil {
		t.Fatalf("%s %s: %q: %v", subject, body, m.Data, err)
	}
	switch {
	case r.Error != nil:
		return fmt.Sprintf("error %d %d %s", r.Error.Code, r.Error.ErrCode, r.Error.Description)
	case r.Message != nil:
		return fmt.Sprintf("message %s %d %s", r.Message.Subject, r.Message.Sequence, r.Message.Data)
	default:
		return fmt.Sprintf("success %v purged %d", r.Success, r.Purged)
	}
}

// Up to the largest sequence jetgres stores, JetStream defines every answer: a purge to just
// below it, publishes that take the last two sequences, Nats-Expected-* headers at and far
// past the last sequence, gets and deletes of sequences beyond the last, up to 2^64-1.
func TestSeqEdgesMatchJetStream(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "E", Subjects: []string{"e.>"}, AllowDirect: true})
	tw.pub("e.a", []byte("1"))

	same := func(what string, got [2]string) {
		t.Helper()
		if got[ours] != got[theirs] {
			t.Errorf("%s:\n jetgres   %s\n JetStream %s", what, got[ours], got[theirs])
		}
	}
	var got [2]string
	purge := fmt.Sprintf(`{"seq":%d}`, seqMax-1)
	for side, js := range tw.js {
		got[side] = apiAnswer(t, js.Conn(), "$JS.API.STREAM.PURGE.E", purge)
	}
	same("purge "+purge, got)
	tw.compareAll("purge " + purge)
	if seq, _ := tw.pub("e.a", []byte("2")); seq != seqMax-1 {
		t.Fatalf("first publish after the purge took %d, want %d", seq, seqMax-1)
	}

	huge := []uint64{seqInt64, seqTopBit, seqUintMax}
	for _, h := range []string{server.JSExpectedLastSeq, server.JSExpectedLastSubjSeq} {
		for _, v := range append([]uint64{seqMax}, huge...) {
			for side, js := range tw.js {
				seq, e := rawPub(t, js.Conn(), "e.a", h, strconv.FormatUint(v, 10))
				got[side] = fmt.Sprintf("seq %d error %+v", seq, e)
			}
			same(fmt.Sprintf("publish with %s %d", h, v), got)
		}
	}
	tw.compareAll("publishes with expected sequences")
	// The last sequence there is, taken as the header expects.
	for side, js := range tw.js {
		seq, e := rawPub(t, js.Conn(), "e.b", server.JSExpectedLastSeq, strconv.FormatUint(seqMax-1, 10))
		got[side] = fmt.Sprintf("seq %d error %+v", seq, e)
	}
	same("publish expecting the last sequence", got)
	if want := fmt.Sprintf("seq %d error <nil>", seqMax); got[ours] != want {
		t.Fatalf("publish of the largest sequence: %s, want %s", got[ours], want)
	}
	tw.compareAll("publish of the largest sequence")

	// Reads beyond the last sequence, where both find nothing. (nats-server's file store
	// does not read back the messages it stored this high after such a purge, so reads of
	// them are checked against jetgres's own answers in TestSeqOverflowRefused.)
	for _, v := range huge {
		for _, body := range []string{fmt.Sprintf(`{"seq":%d}`, v), fmt.Sprintf(`{"seq":%d,"next_by_subj":"e.>"}`, v)} {
			for side, js := range tw.js {
				got[side] = apiAnswer(t, js.Conn(), "$JS.API.STREAM.MSG.GET.E", body)
			}
			same("MSG.GET "+body, got)
			for side, js := range tw.js {
				got[side] = strings.Join(directAnswers(t, js.Conn(), "$JS.API.DIRECT.GET.E", body, false), " | ")
			}
			same("DIRECT.GET "+body, got)
		}
		body := fmt.Sprintf(`{"seq":%d,"batch":3}`, v)
		var many [2][]string
		for side, js := range tw.js {
			many[side] = directAnswers(t, js.Conn(), "$JS.API.DIRECT.GET.E", body, true)
		}
		if !slices.Equal(many[ours], many[theirs]) {
			t.Errorf("DIRECT.GET %s:\n jetgres   %q\n JetStream %q", body, many[ours], many[theirs])
		}
		body = fmt.Sprintf(`{"seq":%d}`, v)
		for side, js := range tw.js {
			got[side] = apiAnswer(t, js.Conn(), "$JS.API.STREAM.MSG.DELETE.E", body)
		}
		same("MSG.DELETE "+body, got)
		body = fmt.Sprintf(`{"keep":%d}`, v)
		for side, js := range tw.js {
			got[side] = apiAnswer(t, js.Conn(), "$JS.API.STREAM.PURGE.E", body)
		}
		same("PURGE "+body, got)
	}
	tw.compareAll("reads, deletes and keeps beyond the last sequence")
}

// Beyond the largest sequence jetgres stores, JetStream would go on; jetgres refuses, with a
// 400 that names the field, and a publish past it is a 503. Nothing is stored wrapped: the
// stream keeps taking and reporting publishes, and a new bridge on the same database finds
// it as it was.
func TestSeqOverflowRefused(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	if _, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "O", Subjects: []string{"o.>"}, AllowDirect: true}); err != nil {
		t.Fatal(err)
	}
	nc := tb.nc
	next := uint64(1)
	publishes := func(what string) {
		t.Helper()
		seq, e := rawPub(t, nc, "o.a")
		if e != nil || seq != next {
			t.Fatalf("after %s: publish got seq %d error %+v, want seq %d", what, seq, e, next)
		}
		if st := streamState(t, nc, "O"); st.LastSeq != next || st.FirstSeq != 1 || st.Msgs != next {
			t.Fatalf("after %s: state %+v, want first 1, last and msgs %d", what, st, next)
		}
		next++
	}
	publishes("create")

	badRequest := server.ApiErrors[server.JSBadRequestErr].ErrCode
	invalidPolicy := server.ApiErrors[server.JSConsumerInvalidPolicyErrF].ErrCode
	for _, v := range []uint64{seqInt64, seqTopBit, seqUintMax} {
		n := strconv.FormatUint(v, 10)
		for _, body := range []string{`{"seq":` + n + `}`, `{"seq":` + n + `,"filter":"o.a"}`} {
			r, raw := apiRequest(t, nc, "$JS.API.STREAM.PURGE.O", []byte(body))
			if r.Error == nil || r.Error.Code != 400 || r.Error.ErrCode != badRequest || !strings.Contains(r.Error.Description, "seq "+n) {
				t.Errorf("purge %s: %s, want 400 err_code %d naming seq", body, raw, badRequest)
			}
			publishes("purge " + body)
		}
		body := fmt.Sprintf(`{"stream_name":"O","config":{"durable_name":"BIG","deliver_policy":"by_start_sequence","opt_start_seq":%s}}`, n)
		r, raw := apiRequest(t, nc, "$JS.API.CONSUMER.CREATE.O.BIG", []byte(body))
		if r.Error == nil || r.Error.Code != 400 || r.Error.ErrCode != invalidPolicy || !strings.Contains(r.Error.Description, "opt_start_seq") {
			t.Errorf("consumer with opt_start_seq %s: %s, want 400 err_code %d naming opt_start_seq", n, raw, invalidPolicy)
		}
		wantAPIError(t, nc, "$JS.API.CONSUMER.INFO.O.BIG", "", server.JSConsumerNotFoundErr)
		wantAPIError(t, nc, "$JS.API.STREAM.MSG.DELETE.O", `{"seq":`+n+`}`, server.JSStreamMsgDeleteFailedF)
		wantAPIError(t, nc, "$JS.API.STREAM.MSG.GET.O", `{"seq":`+n+`}`, server.JSNoMessageFoundErr)
		for _, h := range []string{server.JSExpectedLastSeq, server.JSExpectedLastSubjSeq} {
			if seq, e := rawPub(t, nc, "o.a", h, n); e == nil || e.ErrCode != server.ApiErrors[server.JSStreamWrongLastSequenceErrF].ErrCode {
				t.Errorf("publish with %s %s: seq %d error %+v, want wrong last sequence", h, n, seq, e)
			}
		}
		publishes("requests naming sequence " + n)
	}

	// Purge to the largest sequence: one more message fits, the next publish is a 503 and
	// changes nothing.
	wantAPIOK(t, nc, "$JS.API.STREAM.PURGE.O", fmt.Sprintf(`{"seq":%d}`, seqMax))
	if st := streamState(t, nc, "O"); st.FirstSeq != seqMax || st.LastSeq != seqMax-1 || st.Msgs != 0 {
		t.Fatalf("after the purge to %d: state %+v", seqMax, st)
	}
	wantAPIOK(t, nc, "$JS.API.CONSUMER.CREATE.O.C", fmt.Sprintf(
		`{"stream_name":"O","config":{"durable_name":"C","ack_policy":"explicit","deliver_policy":"by_start_sequence","opt_start_seq":%d}}`, seqMax))
	if seq, e := rawPub(t, nc, "o.last"); e != nil || seq != seqMax {
		t.Fatalf("publish after the purge: seq %d error %+v, want %d", seq, e, seqMax)
	}
	exhausted := func(what string) {
		t.Helper()
		before := reasonCount(t, tb.reg, "jetgres_publish_rejected_total", stream.ReasonLimit)
		seq, e := rawPub(t, nc, "o.a")
		if e == nil || e.Code != 503 || e.ErrCode != server.ApiErrors[server.JSStreamStoreFailedF].ErrCode || !strings.Contains(e.Description, "sequence space exhausted") {
			t.Fatalf("%s: publish got seq %d error %+v, want 503 err_code 10077 sequence space exhausted", what, seq, e)
		}
		if after := reasonCount(t, tb.reg, "jetgres_publish_rejected_total", stream.ReasonLimit); after != before+1 {
			t.Errorf("%s: rejected{reason=limit} went from %v to %v", what, before, after)
		}
	}
	full := func(what string, msgs uint64) {
		t.Helper()
		exhausted(what)
		if st := streamState(t, nc, "O"); st.LastSeq != seqMax || st.Msgs != msgs {
			t.Fatalf("%s: state %+v, want last %d and %d messages", what, st, seqMax, msgs)
		}
	}
	full("a publish past the largest sequence", 1)
	// Several at once, as an async publisher sends them: every one refused.
	var futures []jetstream.PubAckFuture
	for range 5 {
		f, err := tb.js.PublishAsync("o.a", nil)
		if err != nil {
			t.Fatal(err)
		}
		futures = append(futures, f)
	}
	for i, f := range futures {
		select {
		case ack := <-f.Ok():
			t.Errorf("async publish %d stored as %d", i, ack.Sequence)
		case err := <-f.Err():
			if errCode(t, ours, err) != jetstream.ErrorCode(server.ApiErrors[server.JSStreamStoreFailedF].ErrCode) {
				t.Errorf("async publish %d: %v", i, err)
			}
		case <-ctx.Done():
			t.Fatal("no answer to an async publish")
		}
	}
	if got := apiAnswer(t, nc, "$JS.API.STREAM.MSG.GET.O", fmt.Sprintf(`{"seq":%d}`, seqMax)); got != fmt.Sprintf("message o.last %d x", seqMax) {
		t.Fatalf("get of the largest sequence: %s", got)
	}
	last := strconv.FormatUint(seqMax, 10)
	if got := strings.Join(directAnswers(t, nc, "$JS.API.DIRECT.GET.O", `{"seq":`+last+`}`, false), ""); !strings.Contains(got, "Nats-Sequence="+last+" ") {
		t.Errorf("direct get of the largest sequence: %s", got)
	}
	if got := directAnswers(t, nc, "$JS.API.DIRECT.GET.O", fmt.Sprintf(`{"multi_last":["o.>"],"up_to_seq":%d}`, seqUintMax), true); len(got) != 2 ||
		!strings.Contains(got[0], "Nats-Sequence="+last+" ") || !strings.Contains(got[1], "Nats-UpTo-Sequence="+last+" ") {
		t.Errorf("direct get of the last per subject up to 2^64-1: %q", got)
	}
	for _, v := range []uint64{seqInt64, seqTopBit, seqUintMax} {
		for _, body := range []string{fmt.Sprintf(`{"seq":%d}`, v), fmt.Sprintf(`{"seq":%d,"batch":2}`, v), fmt.Sprintf(`{"seq":%d,"next_by_subj":">"}`, v)} {
			if got := strings.Join(directAnswers(t, nc, "$JS.API.DIRECT.GET.O", body, false), ""); got != "Description=Message Not Found Status=404 data=" {
				t.Errorf("direct get %s: %s", body, got)
			}
		}
	}
	cons, err := tb.js.Consumer(ctx, "O", "C")
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		md, err := m.Metadata()
		if err != nil || md.Sequence.Stream != seqMax {
			t.Fatalf("delivered %+v (%v), want stream sequence %d", md, err, seqMax)
		}
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// A new bridge on the same database finds all of it as it was.
	tb.stop(t)
	tb = setup(t, setupOpts{db: tb.db})
	nc = tb.nc
	testwait.For(t, 10*time.Second, func() error {
		if r, raw := apiRequest(t, nc, "$JS.API.CONSUMER.INFO.O.C", nil); r.Error != nil {
			return fmt.Errorf("consumer info after a restart: %s", raw)
		}
		return nil
	})
	info, err := tb.js.Consumer(ctx, "O", "C")
	if err != nil {
		t.Fatal(err)
	}
	if f := info.CachedInfo().AckFloor.Stream; f != seqMax {
		t.Errorf("ack floor after a restart: %d, want %d", f, seqMax)
	}
	full("a publish after a restart", 1)
	// Purged empty, the stream's first sequence is one past the largest: still storable.
	wantAPIOK(t, nc, "$JS.API.STREAM.PURGE.O", "")
	if st := streamState(t, nc, "O"); st.FirstSeq != seqInt64 || st.LastSeq != seqMax || st.Msgs != 0 {
		t.Fatalf("after purging everything: state %+v", st)
	}
	full("a publish after purging everything", 0)
	tb.stop(t)
	tb = setup(t, setupOpts{db: tb.db})
	nc = tb.nc
	testwait.For(t, 10*time.Second, func() error {
		if r, raw := apiRequest(t, nc, "$JS.API.STREAM.INFO.O", nil); r.Error != nil {
			return fmt.Errorf("stream info after a restart: %s", raw)
		}
		return nil
	})
	if st := streamState(t, nc, "O"); st.FirstSeq != seqInt64 || st.LastSeq != seqMax || st.Msgs != 0 {
		t.Fatalf("after a restart: state %+v", st)
	}
	full("a publish to the purged stream after a restart", 0)
	// Deleted and created again, the stream starts over.
	wantAPIOK(t, nc, "$JS.API.STREAM.DELETE.O", "")
	if _, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "O", Subjects: []string{"o.>"}}); err != nil {
		t.Fatal(err)
	}
	next = 1
	publishes("a delete and a new create")
}

// A batch that reaches the largest sequence stores what fits and refuses the rest, on the
// fast path (no expectations) and on the general one (message ids) alike.
func TestSeqExhaustedMidBatch(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	for _, name := range []string{"F", "G"} {
		if _, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{strings.ToLower(name) + ".>"}}); err != nil {
			t.Fatal(err)
		}
		// A publish first, so that the bridge knows the stream's tail and may take the
		// fast path.
		if _, e := rawPub(t, tb.nc, strings.ToLower(name)+".a"); e != nil {
			t.Fatal(e)
		}
		wantAPIOK(t, tb.nc, "$JS.API.STREAM.PURGE."+name, fmt.Sprintf(`{"seq":%d}`, seqMax-2))
	}
	for _, name := range []string{"F", "G"} {
		var futures []jetstream.PubAckFuture
		for i := range 6 {
			var opts []jetstream.PublishOpt
			if name == "G" {
				opts = append(opts, jetstream.WithMsgID(fmt.Sprintf("id-%d", i)))
			}
			f, err := tb.js.PublishAsync(strings.ToLower(name)+".a", []byte{byte(i)}, opts...)
			if err != nil {
				t.Fatal(err)
			}
			futures = append(futures, f)
		}
		var stored []uint64
		refused := 0
		for _, f := range futures {
			select {
			case ack := <-f.Ok():
				stored = append(stored, ack.Sequence)
			case err := <-f.Err():
				if errCode(t, ours, err) != jetstream.ErrorCode(server.ApiErrors[server.JSStreamStoreFailedF].ErrCode) {
					t.Errorf("%s: %v", name, err)
				}
				refused++
			case <-ctx.Done():
				t.Fatal("no answer to an async publish")
			}
		}
		if want := []uint64{seqMax - 2, seqMax - 1, seqMax}; !slices.Equal(stored, want) || refused != 3 {
			t.Errorf("%s: stored %v and refused %d, want %v and 3", name, stored, refused, want)
		}
		if st := streamState(t, tb.nc, name); st.FirstSeq != seqMax-2 || st.LastSeq != seqMax || st.Msgs != 3 {
			t.Errorf("%s: state %+v", name, st)
		}
	}
}

// A stream's first_seq is where its first message goes, as in JetStream, up to the largest
// sequence jetgres stores; above it, the create is refused with a 400 naming the field.
func TestStreamFirstSeq(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	for _, first := range []uint64{0, 1, 100, seqMax} {
		name := fmt.Sprintf("FS%d", first%1000)
		subject := strings.ToLower(name) + ".a"
		tw.createStream(jetstream.StreamConfig{Name: name, Subjects: []string{subject}, FirstSeq: first})
		if seq, _ := tw.pub(subject, []byte("1")); seq != max(first, 1) {
			t.Errorf("first_seq %d: the first publish took %d", first, seq)
		}
	}
	badRequest := server.ApiErrors[server.JSBadRequestErr].ErrCode
	for _, first := range []uint64{seqInt64, seqTopBit, seqUintMax} {
		body := fmt.Sprintf(`{"name":"BIG","subjects":["big"],"first_seq":%d}`, first)
		r, raw := apiRequest(t, tw.tb.nc, "$JS.API.STREAM.CREATE.BIG", []byte(body))
		if r.Error == nil || r.Error.Code != 400 || r.Error.ErrCode != badRequest || !strings.Contains(r.Error.Description, fmt.Sprintf("first_seq %d", first)) {
			t.Errorf("create with first_seq %d: %s, want 400 err_code %d naming first_seq", first, raw, badRequest)
		}
		wantAPIError(t, tw.tb.nc, "$JS.API.STREAM.INFO.BIG", "", server.JSStreamNotFoundErr)
	}
	// A new bridge on the same database finds the stream that starts at the largest sequence
	// full, and refuses the next publish cleanly.
	tw.tb.stop(t)
	tb := setup(t, setupOpts{db: tw.tb.db})
	name := fmt.Sprintf("FS%d", seqMax%1000)
	testwait.For(t, 10*time.Second, func() error {
		if r, raw := apiRequest(t, tb.nc, "$JS.API.STREAM.INFO."+name, nil); r.Error != nil {
			return fmt.Errorf("stream info after a restart: %s", raw)
		}
		return nil
	})
	if st := streamState(t, tb.nc, name); st.FirstSeq != seqMax || st.LastSeq != seqMax || st.Msgs != 1 {
		t.Fatalf("after a restart: state %+v", st)
	}
	if seq, e := rawPub(t, tb.nc, strings.ToLower(name)+".a"); e == nil || e.Code != 503 {
		t.Fatalf("publish past the largest sequence: seq %d error %+v", seq, e)
	}
}
