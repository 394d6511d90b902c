package bridge

// Hostile and nonsensical input: malformed and mistyped API requests, absurd values, names
// and subjects built to upset SQL or subject matching, and acks for deliveries nobody was
// sent. Each must end in a clear JetStream error, or for acks in what JetStream itself does,
// and leave the server storing and delivering ordinary messages.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/bridge/stream"
	"github.com/jetgres/jetgres/internal/jswire"
)

// jsonAPIReply is the part of every JetStream API response these tests look at.
type jsonAPIReply struct {
	Type  string           `json:"type"`
	Error *server.ApiError `json:"error"`
}

// apiRequest sends body to an API subject and returns the decoded reply and its raw bytes.
func apiRequest(t *testing.T, nc *nats.Conn, subject string, body []byte) (jsonAPIReply, []byte) {
	t.Helper()
	// A bound on a hang, not on speed: a loaded machine may take seconds over a large
	// request.
	m, err := nc.Request(subject, body, 30*time.Second)
	if err != nil {
		t.Fatalf("%s %q: %v", subject, body, err)
	}
	var r jsonAPIReply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		t.Fatalf("%s %q: reply %q is not JSON: %v", subject, body, m.Data, err)
	}
	if !strings.HasPrefix(r.Type, "io.nats.jetstream.api.v1.") {
		t.Errorf("%s %q: reply %s has no JetStream type", subject, body, m.Data)
	}
	return r, m.Data
}

// wantAPIError fails the test unless the reply to body on subject is the JetStream error id.
func wantAPIError(t *testing.T, nc *nats.Conn, subject, body string, id server.ErrorIdentifier) {
	t.Helper()
	r, raw := apiRequest(t, nc, subject, []byte(body))
	if want := server.ApiErrors[id].ErrCode; r.Error == nil || r.Error.ErrCode != want {
		t.Errorf("%s %q: reply %s, want err_code %d", subject, body, raw, want)
	}
}

// wantAPIOK fails the test if the reply to body on subject is an error.
func wantAPIOK(t *testing.T, nc *nats.Conn, subject, body string) []byte {
	t.Helper()
	r, raw := apiRequest(t, nc, subject, []byte(body))
	if r.Error != nil {
		t.Errorf("%s %q: error reply %s", subject, body, raw)
	}
	return raw
}

// prober publishes and fetches through a stream of its own: after every hostile step the
// server must still store and deliver an ordinary message.
type prober struct {
	t   *testing.T
	ctx context.Context
	js  jetstream.JetStream
	c   jetstream.Consumer
	n   int
}

func newProber(t *testing.T, ctx context.Context, tb *testBundle) *prober {
	t.Helper()
	s := newStream(t, ctx, tb, "PROBE", "probe.>")
	c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "P", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatalf("probe consumer: %v", err)
	}
	return &prober{t: t, ctx: ctx, js: tb.js, c: c}
}

func (p *prober) check(after string) {
	p.t.Helper()
	p.n++
	want := fmt.Sprintf("probe %d", p.n)
	ack, err := p.js.Publish(p.ctx, "probe.x", []byte(want))
	if err != nil {
		p.t.Fatalf("after %s: publish: %v", after, err)
	}
	b, err := p.c.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		p.t.Fatalf("after %s: fetch: %v", after, err)
	}
	var got []string
	for m := range b.Messages() {
		got = append(got, string(m.Data()))
		if err := m.DoubleAck(p.ctx); err != nil {
			p.t.Fatalf("after %s: ack: %v", after, err)
		}
	}
	if len(got) != 1 || got[0] != want || b.Error() != nil {
		p.t.Fatalf("after %s: fetched %q (err %v), want %q at seq %d", after, got, b.Error(), want, ack.Sequence)
	}
}

// pullStatusOf sends one MSG.NEXT with a raw body to $JS.API.CONSUMER.MSG.NEXT.<target> and
// returns the first answer: "" for a message, else its status line.
func pullStatusOf(t *testing.T, nc *nats.Conn, target, body string) string {
	t.Helper()
	inbox := nats.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest("$JS.API.CONSUMER.MSG.NEXT."+target, inbox, []byte(body)); err != nil {
		t.Fatal(err)
	}
	m, err := sub.NextMsg(5 * time.Second)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		// nats.go turns the 503 status into this error.
		return "503 No Responders"
	case err != nil:
		t.Fatalf("pull on %s with %q: no answer: %v", target, body, err)
	}
	return statusLine(m)
}

func TestHostileAPIRequests(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	nc := tb.nc
	probe := newProber(t, ctx, tb)
	s := newStream(t, ctx, tb, "S", "s.>")
	publishN(t, ctx, tb.js, "s.a", 3)
	if _, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}

	malformed := []string{`{`, `{"name":`, `[1,2`, `{"a":}`, "\xff\xfe{", `{"a":1} trailing`, `nonsense`, "{\x00}"}
	withTypos := func(extra ...string) []string { return append(slices.Clone(malformed), extra...) }
	cases := []struct {
		subject string
		bodies  []string
		want    server.ErrorIdentifier
	}{
		{"$JS.API.STREAM.CREATE.X", withTypos(`{"name":5}`, `{"subjects":"x.>"}`, `{"max_age":"1h"}`, `{"retention":"forever"}`,
			`{"storage":7}`, `{"discard":true}`, `{"max_bytes":1e40}`, `{"num_replicas":"3"}`, `[]`), server.JSInvalidJSONErr},
		{"$JS.API.STREAM.UPDATE.S", withTypos(`{"subjects":"s.>"}`, `{"max_msgs":"10"}`, `{"deny_delete":"yes"}`), server.JSInvalidJSONErr},
		{"$JS.API.STREAM.INFO.S", withTypos(`{"deleted_details":"yes"}`, `{"subjects_filter":5}`), server.JSInvalidJSONErr},
		{"$JS.API.STREAM.DELETE.S", withTypos(`{"name":"S"}`, `null`), server.JSNotEmptyRequestErr},
		{"$JS.API.STREAM.PURGE.S", withTypos(`{"seq":-1}`, `{"keep":"all"}`, `{"filter":5}`), server.JSInvalidJSONErr},
		{"$JS.API.STREAM.NAMES", withTypos(`{"offset":"1"}`, `{"subject":5}`), server.JSInvalidJSONErr},
		{"$JS.API.STREAM.LIST", withTypos(`{"offset":-1.5}`, `{"subject":["s.>"]}`), server.JSInvalidJSONErr},
		{"$JS.API.STREAM.MSG.GET.S", withTypos(`{"seq":"1"}`, `{"seq":-1}`, `{"last_by_subj":1}`), server.JSInvalidJSONErr},
		{"$JS.API.STREAM.MSG.DELETE.S", withTypos(`{"seq":"1"}`, `{"seq":1,"no_erase":"yes"}`), server.JSInvalidJSONErr},
		{"$JS.API.CONSUMER.CREATE.S.C2", withTypos(`{"stream_name":"S","config":"x"}`,
			`{"stream_name":"S","config":{"ack_policy":"sometimes"}}`, `{"stream_name":"S","config":{"durable_name":["C2"]}}`,
			`{"stream_name":5}`, `{"stream_name":"S","action":"destroy","config":{}}`, `{"stream_name":"S","config":{"ack_wait":"30s"}}`,
			`{"stream_name":"S","config":{"deliver_policy":"sometime"}}`, `{"stream_name":"S","config":{"opt_start_time":"yesterday","deliver_policy":"by_start_time"}}`),
			server.JSInvalidJSONErr},
		{"$JS.API.CONSUMER.DURABLE.CREATE.S.C2", withTypos(`{"stream_name":"S","config":{"durable_name":"C2","max_deliver":"3"}}`), server.JSInvalidJSONErr},
		{"$JS.API.CONSUMER.INFO.S.C", withTypos(`{"name":"C"}`), server.JSNotEmptyRequestErr},
		{"$JS.API.CONSUMER.DELETE.S.C", withTypos(`{"name":"C"}`), server.JSNotEmptyRequestErr},
		{"$JS.API.CONSUMER.NAMES.S", withTypos(`{"offset":"1"}`), server.JSInvalidJSONErr},
		{"$JS.API.CONSUMER.LIST.S", withTypos(`{"offset":true}`), server.JSInvalidJSONErr},
		// Empty bodies where a request is required.
		{"$JS.API.STREAM.MSG.GET.S", []string{"", "{}", `{"seq":0}`, `{"seq":1,"last_by_subj":"s.a"}`}, server.JSBadRequestErr},
		{"$JS.API.STREAM.MSG.DELETE.S", []string{"", "{}", `{"seq":0}`}, server.JSBadRequestErr},
		// Subjects that are not (or not all of) an API request.
		{"$JS.API.NOPE", []string{""}, server.JSBadRequestErr},
		{"$JS.API.STREAM", []string{""}, server.JSBadRequestErr},
		{"$JS.API.STREAM.CREATE", []string{`{"name":"S"}`}, server.JSBadRequestErr},
		{"$JS.API.STREAM.CREATE.A.B", []string{`{"name":"A"}`}, server.JSBadRequestErr},
		{"$JS.API.STREAM.INFO.S.extra", []string{""}, server.JSBadRequestErr},
		{"$JS.API.STREAM.MSG.GET", []string{`{"seq":1}`}, server.JSBadRequestErr},
		{"$JS.API.STREAM.LEADER.STEPDOWN.S", []string{"{}"}, server.JSClusterUnSupportFeatureErr},
		{"$JS.API.STREAM.SNAPSHOT.S", []string{`{"deliver_subject":"a.*"}`, `{"deliver_subject":"$JS.API.X"}`}, server.JSSnapshotDeliverSubjectInvalidErr},
		{"$JS.API.CONSUMER", []string{""}, server.JSBadRequestErr},
		{"$JS.API.CONSUMER.INFO.S", []string{""}, server.JSBadRequestErr},
		{"$JS.API.CONSUMER.NAMES", []string{""}, server.JSBadRequestErr},
		// Unknown streams and consumers.
		{"$JS.API.STREAM.INFO.NOPE", []string{""}, server.JSStreamNotFoundErr},
		{"$JS.API.STREAM.UPDATE.NOPE", []string{`{"subjects":["nope.>"]}`}, server.JSStreamNotFoundErr},
		{"$JS.API.STREAM.DELETE.NOPE", []string{""}, server.JSStreamNotFoundErr},
		{"$JS.API.STREAM.PURGE.NOPE", []string{""}, server.JSStreamNotFoundErr},
		{"$JS.API.STREAM.MSG.GET.NOPE", []string{`{"seq":1}`}, server.JSStreamNotFoundErr},
		{"$JS.API.STREAM.MSG.DELETE.NOPE", []string{`{"seq":1}`}, server.JSStreamNotFoundErr},
		{"$JS.API.CONSUMER.CREATE.NOPE.C", []string{`{"stream_name":"NOPE","config":{"durable_name":"C"}}`}, server.JSStreamNotFoundErr},
		{"$JS.API.CONSUMER.INFO.NOPE.C", []string{""}, server.JSStreamNotFoundErr},
		{"$JS.API.CONSUMER.DELETE.NOPE.C", []string{""}, server.JSStreamNotFoundErr},
		{"$JS.API.CONSUMER.NAMES.NOPE", []string{""}, server.JSStreamNotFoundErr},
		{"$JS.API.CONSUMER.LIST.NOPE", []string{""}, server.JSStreamNotFoundErr},
		{"$JS.API.CONSUMER.INFO.S.NOPE", []string{""}, server.JSConsumerNotFoundErr},
		{"$JS.API.CONSUMER.DELETE.S.NOPE", []string{""}, server.JSConsumerNotFoundErr},
		{"$JS.API.CONSUMER.PAUSE.NOPE.C", []string{"{}"}, server.JSStreamNotFoundErr},
		{"$JS.API.CONSUMER.PAUSE.S.NOPE", []string{"{}"}, server.JSConsumerNotFoundErr},
		{"$JS.API.CONSUMER.PAUSE.S.C", []string{"{bad", `{"pause_until":"tomorrow"}`}, server.JSInvalidJSONErr},
		{"$JS.API.STREAM.MSG.GET.S", []string{`{"seq":18446744073709551615}`, `{"last_by_subj":"s.none"}`, `{"next_by_subj":"s.a","seq":99}`}, server.JSNoMessageFoundErr},
	}
	for _, c := range cases {
		for _, body := range c.bodies {
			wantAPIError(t, nc, c.subject, body, c.want)
		}
		probe.check(c.subject)
	}

	// $JS.API.INFO takes no request and ignores what comes with it, as nats-server does.
	wantAPIOK(t, nc, "$JS.API.INFO", `{"garbage`)

	for _, body := range []string{`{`, `{"batch":"1"}`, `{"expires":"1s"}`, `{"no_wait":1}`, `{"batch":1e30}`, "{\xff"} {
		if got := pullStatusOf(t, nc, "S.C", body); !strings.HasPrefix(got, "400 ") {
			t.Errorf("pull with %q: %q, want 400", body, got)
		}
	}
	for target, want := range map[string]string{
		"S": "400 ", "S.C.extra": "400 ",
		// An empty token makes the subject invalid: the server answers no responders itself.
		"S.": "503 ", ".C": "503 ",
		// No responders, as nats-server answers for a consumer it does not have.
		"NOPE.C": "503 ", "S.NOPE": "503 ",
	} {
		if got := pullStatusOf(t, nc, target, ""); !strings.HasPrefix(got, want) {
			t.Errorf("pull on MSG.NEXT.%s: %q, want %s", target, got, want)
		}
	}
	probe.check("malformed pulls")

	// Nothing above may have changed anything.
	sl := tb.js.StreamNames(ctx)
	names, err := collectNames(sl.Name(), sl.Err)
	if err != nil || !slices.Equal(names, []string{"PROBE", "S"}) {
		t.Errorf("streams after hostile requests: %v, %v", names, err)
	}
	info, err := s.Info(ctx)
	if err != nil || info.State.Msgs != 3 || info.State.FirstSeq != 1 || info.State.LastSeq != 3 || len(info.Config.Subjects) != 1 || info.Config.Subjects[0] != "s.>" {
		t.Errorf("stream S after hostile requests: %+v, %v", info, err)
	}
	cl := s.ConsumerNames(ctx)
	cnames, err := collectNames(cl.Name(), cl.Err)
	if err != nil || !slices.Equal(cnames, []string{"C"}) {
		t.Errorf("consumers of S after hostile requests: %v, %v", cnames, err)
	}
	ci, err := s.Consumer(ctx, "C")
	if err != nil || ci.CachedInfo().NumPending != 3 || ci.CachedInfo().Delivered.Stream != 0 {
		t.Errorf("consumer C after hostile requests: %+v, %v", ci, err)
	}
}

// collectNames drains a name lister.
func collectNames(names <-chan string, errf func() error) ([]string, error) {
	var out []string
	for n := range names {
		out = append(out, n)
	}
	slices.Sort(out)
	return out, errf()
}

func TestHostileNames(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	nc := tb.nc
	probe := newProber(t, ctx, tb)

	// Names a stream or consumer may have: SQL and regular-expression metacharacters and
	// unicode are plain characters to JetStream, and must stay so on the way to PostgreSQL.
	valid := []string{
		`x';DROP_TABLE_streams;--`,
		`"quoted"`, `per%cent_under_`, `a$1(b)|[c]+?^`, `流れ`, `émoji-🚀`, `NULL`, `--`,
		strings.Repeat("n", server.JSMaxNameLen),
	}
	for i, name := range valid {
		subj := fmt.Sprintf("names.%d.>", i)
		wantAPIOK(t, nc, "$JS.API.STREAM.CREATE."+name, fmt.Sprintf(`{"name":%q,"subjects":[%q]}`, name, subj))
		s, err := tb.js.Stream(ctx, name)
		if err != nil {
			t.Fatalf("stream %q: %v", name, err)
		}
		if _, err := tb.js.Publish(ctx, fmt.Sprintf("names.%d.x", i), []byte(name)); err != nil {
			t.Fatalf("publish to %q: %v", name, err)
		}
		c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: name, AckPolicy: jetstream.AckExplicitPolicy})
		if err != nil {
			t.Fatalf("consumer %q: %v", name, err)
		}
		b, err := c.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range b.Messages() {
			md, err := m.Metadata()
			if err != nil || md.Stream != name || md.Consumer != name || string(m.Data()) != name {
				t.Errorf("message from %q: %+v, %v", name, md, err)
			}
			if err := m.DoubleAck(ctx); err != nil {
				t.Errorf("ack on %q: %v", name, err)
			}
		}
		if info, err := c.Info(ctx); err != nil || info.AckFloor.Stream != 1 {
			t.Errorf("consumer %q after ack: %+v, %v", name, info, err)
		}
		probe.check("stream " + name)
	}
	sl := tb.js.StreamNames(ctx)
	names, err := collectNames(sl.Name(), sl.Err)
	if want := append(slices.Clone(valid), "PROBE"); err != nil || !slices.Equal(names, slices.Sorted(slices.Values(want))) {
		t.Errorf("streams: %q, %v; want %q", names, err, want)
	}

	// Names no stream or consumer may have. Those that cannot be spelled in a subject token
	// are tried through the request body alone.
	invalid := []string{"a b", "tab\there", "dot.ted", "star*", "gt>", `back\slash`, "sl/ash", "nul\x00l", "bad\xffutf8",
		strings.Repeat("n", server.JSMaxNameLen+1)}
	for _, name := range invalid {
		refused := func(subject, body string) {
			t.Helper()
			r, raw := apiRequest(t, nc, subject, []byte(body))
			if r.Error == nil || strings.Contains(r.Error.Description, "database") {
				t.Errorf("%s with %q: %s, want a configuration error", subject, body, raw)
			}
		}
		quoted, err := json.Marshal(name)
		if err != nil {
			t.Fatal(err)
		}
		if utf8.ValidString(name) {
			refused("$JS.API.STREAM.CREATE.PLAIN", fmt.Sprintf(`{"name":%s,"subjects":["bad.names"]}`, quoted))
			refused("$JS.API.CONSUMER.CREATE.PROBE", fmt.Sprintf(`{"stream_name":"PROBE","config":{"name":%s}}`, quoted))
		}
		if !strings.ContainsAny(name, " \t.*>") {
			// A valid subject token: name it in the subject, with nothing in the body to
			// contradict it (JSON would have turned invalid UTF-8 into U+FFFD).
			refused("$JS.API.STREAM.CREATE."+name, `{"subjects":["bad.names"]}`)
			refused("$JS.API.CONSUMER.CREATE.PROBE."+name, `{"stream_name":"PROBE","config":{}}`)
			refused("$JS.API.CONSUMER.CREATE.PROBE."+name+".probe.x", `{"stream_name":"PROBE","config":{"filter_subject":"probe.x"}}`)
		}
		probe.check(fmt.Sprintf("name %q", name))
	}
	sl = tb.js.StreamNames(ctx)
	if after, err := collectNames(sl.Name(), sl.Err); err != nil || !slices.Equal(after, names) {
		t.Errorf("streams changed by invalid names: %q, %v", after, err)
	}
	ps, err := tb.js.Stream(ctx, "PROBE")
	if err != nil {
		t.Fatal(err)
	}
	cl := ps.ConsumerNames(ctx)
	if cons, err := collectNames(cl.Name(), cl.Err); err != nil || !slices.Equal(cons, []string{"P"}) {
		t.Errorf("consumers of PROBE after invalid names: %q, %v", cons, err)
	}
}

func TestHostileSubjects(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	nc := tb.nc
	probe := newProber(t, ctx, tb)
	newStream(t, ctx, tb, "A", "o.>")

	create := func(name string, subjects ...string) jsonAPIReply {
		t.Helper()
		body, err := json.Marshal(map[string]any{"name": name, "subjects": subjects})
		if err != nil {
			t.Fatal(err)
		}
		r, _ := apiRequest(t, nc, "$JS.API.STREAM.CREATE."+name, body)
		return r
	}
	// Overlaps with another stream, with itself, and with the subjects the server and the
	// bridge live on.
	for _, c := range []struct {
		subjects []string
		want     server.ErrorIdentifier
	}{
		{[]string{"o.x"}, server.JSStreamSubjectOverlapErr},
		{[]string{"o.*.y"}, server.JSStreamSubjectOverlapErr},
		{[]string{"o.*"}, server.JSStreamSubjectOverlapErr},
		{[]string{"p.1", ">"}, server.JSStreamInvalidConfigF},
		{[]string{"q.>", "q.a"}, server.JSStreamInvalidConfigF},
		{[]string{"q.*", "q.a"}, server.JSStreamInvalidConfigF},
		{[]string{"q.a", "q.a"}, server.JSStreamInvalidConfigF},
		{[]string{"$JS.API.>"}, server.JSStreamInvalidConfigF},
		{[]string{"$JS.ACK.A.>"}, server.JSStreamInvalidConfigF},
		{[]string{"*.ACK.>"}, server.JSStreamInvalidConfigF},
		{[]string{"_INBOX.*"}, server.JSStreamInvalidConfigF},
		{[]string{"$SYS.>"}, server.JSStreamInvalidConfigF},
		{[]string{"q..a"}, server.JSStreamInvalidConfigF},
		{[]string{"q.a "}, server.JSStreamInvalidConfigF},
		{[]string{"q.>.a"}, server.JSStreamInvalidConfigF},
		{[]string{"q.\x00"}, server.JSStreamInvalidConfigF},
		{[]string{""}, server.JSStreamInvalidConfigF},
	} {
		r := create("B", c.subjects...)
		if want := server.ApiErrors[c.want].ErrCode; r.Error == nil || r.Error.ErrCode != want {
			t.Errorf("stream B on %q: %+v, want err_code %d", c.subjects, r.Error, want)
		}
	}
	if r := create("B", "p.>"); r.Error != nil {
		t.Fatalf("stream B on p.>: %v", r.Error)
	}
	// An update into A's subjects is refused and leaves B as it was.
	body, _ := json.Marshal(map[string]any{"name": "B", "subjects": []string{"p.>", "o.z"}})
	wantAPIError(t, nc, "$JS.API.STREAM.UPDATE.B", string(body), server.JSStreamSubjectOverlapErr)
	if info, err := tb.js.Stream(ctx, "B"); err != nil || !slices.Equal(info.CachedInfo().Config.Subjects, []string{"p.>"}) {
		t.Fatalf("B after a refused update: %+v, %v", info, err)
	}
	ack, err := tb.js.Publish(ctx, "o.z", []byte("to A"))
	if err != nil || ack.Stream != "A" {
		t.Fatalf("publish o.z: %+v, %v", ack, err)
	}
	probe.check("overlapping subjects")

	// Every pair of a stream's subjects is checked for overlap, so their number is bounded.
	many := make([]string, jswire.MaxStreamSubjects+1)
	for i := range many {
		many[i] = fmt.Sprintf("many.%d.*", i)
	}
	// How fast the largest stream is checked is a benchmark's business; a check that does
	// not end fails the request.
	if r := create("MANY", many...); r.Error == nil || r.Error.ErrCode != server.ApiErrors[server.JSStreamInvalidConfigF].ErrCode {
		t.Errorf("stream with %d subjects: %+v", len(many), r.Error)
	}
	if r := create("MANY", many[:jswire.MaxStreamSubjects]...); r.Error != nil {
		t.Errorf("stream with %d subjects: %v", jswire.MaxStreamSubjects, r.Error)
	}
	probe.check("many subjects")

	// Filters built from regular-expression metacharacters match literally.
	newStream(t, ctx, tb, "RE", "re.>")
	for _, subj := range []string{"re.a|b", "re.a", "re.(x)+", "re.x", "re.[^.]", "re.q", "re.\\d"} {
		if _, err := tb.js.Publish(ctx, subj, []byte(subj)); err != nil {
			t.Fatalf("publish %q: %v", subj, err)
		}
	}
	for filter, want := range map[string][]string{
		"re.a|b": {"re.a|b"}, "re.(x)+": {"re.(x)+"}, "re.[^.]": {"re.[^.]"}, "re.\\d": {"re.\\d"},
	} {
		c, err := tb.js.CreateOrUpdateConsumer(ctx, "RE", jetstream.ConsumerConfig{FilterSubject: filter, AckPolicy: jetstream.AckNonePolicy})
		if err != nil {
			t.Fatalf("consumer on %q: %v", filter, err)
		}
		b, err := c.FetchNoWait(10)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for m := range b.Messages() {
			got = append(got, m.Subject())
		}
		if !slices.Equal(got, want) {
			t.Errorf("filter %q delivered %q, want %q", filter, got, want)
		}
	}
	probe.check("regular-expression filters")
}

// TestHostilePublishes sends publishes PostgreSQL cannot store as text (NUL bytes, invalid
// UTF-8 in the subject or in a header that is stored) while ordinary publishes go on: the
// bad ones must be refused on their own, without failing the transaction the good ones
// share with them.
func TestHostilePublishes(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	probe := newProber(t, ctx, tb)
	newStream(t, ctx, tb, "H", "h.>")

	bad := []*nats.Msg{
		{Subject: "h.nul\x00"},
		{Subject: "h.\xff\xfe"},
		{Subject: "h.ok", Header: nats.Header{"Nats-Msg-Id": {"id\x00"}}},
		{Subject: "h.ok", Header: nats.Header{"Nats-Msg-Id": {"id\xff"}}},
		{Subject: "h.ok", Header: nats.Header{"Nats-Expected-Last-Msg-Id": {"id\xff"}}},
		{Subject: "h.ok", Header: nats.Header{"Nats-Expected-Last-Subject-Sequence": {"0"}, "Nats-Expected-Last-Subject-Sequence-Subject": {"h.\xff"}}},
		// Too long for a B-tree entry, even compressed.
		{Subject: "h." + incompressible(3000)},
		{Subject: "h.ok", Header: nats.Header{"Nats-Msg-Id": {incompressible(3000)}}},
	}
	goodAcks := make([]jetstream.PubAckFuture, 0, 200)
	badReplies := make([]*nats.Subscription, 0, len(bad))
	for round := range 20 {
		for i := range 10 {
			f, err := tb.js.PublishAsync(fmt.Sprintf("h.good.%d", round), []byte{byte(i)})
			if err != nil {
				t.Fatal(err)
			}
			goodAcks = append(goodAcks, f)
		}
		if round < len(bad) {
			m := bad[round]
			m.Reply = nats.NewInbox()
			sub, err := tb.nc.SubscribeSync(m.Reply)
			if err != nil {
				t.Fatal(err)
			}
			badReplies = append(badReplies, sub)
			if err := tb.nc.PublishMsg(m); err != nil {
				t.Fatal(err)
			}
		}
	}
	select {
	case <-tb.js.PublishAsyncComplete():
	case <-time.After(10 * time.Second):
		t.Fatal("good publishes not acknowledged")
	}
	for i, f := range goodAcks {
		select {
		case err := <-f.Err():
			t.Errorf("good publish %d failed: %v", i, err)
		case <-f.Ok():
		}
	}
	for i, sub := range badReplies {
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("bad publish %d (%q %v): no answer: %v", i, bad[i].Subject, bad[i].Header, err)
		}
		var r jsonAPIReply
		if err := json.Unmarshal(m.Data, &r); err != nil || r.Error == nil || r.Error.Code != 400 {
			t.Errorf("bad publish %d (%q %v): answer %q, want a 400 error", i, bad[i].Subject, bad[i].Header, m.Data)
		}
	}
	// The longest subject and message id that may be stored are stored.
	longest := "h." + strings.Repeat("y", stream.MaxStoredText-2)
	if _, err := tb.js.Publish(ctx, longest, nil, jetstream.WithMsgID(strings.Repeat("m", stream.MaxStoredText))); err != nil {
		t.Fatalf("publish with a subject and id of %d bytes: %v", stream.MaxStoredText, err)
	}
	s, err := tb.js.Stream(ctx, "H")
	if err != nil {
		t.Fatal(err)
	}
	if st := s.CachedInfo().State; st.Msgs != uint64(len(goodAcks)+1) || st.LastSeq != uint64(len(goodAcks)+1) {
		t.Errorf("stream H holds %d messages up to %d, want the %d good ones", st.Msgs, st.LastSeq, len(goodAcks)+1)
	}
	if m, err := s.GetLastMsgForSubject(ctx, longest); err != nil || m.Sequence != uint64(len(goodAcks)+1) {
		t.Errorf("last message on the longest subject: %+v, %v", m, err)
	}
	probe.check("unstorable publishes")
}

// incompressible returns n printable bytes without the repetition PostgreSQL's compression
// of long index entries would feed on.
func incompressible(n int) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	r := rand.New(rand.NewPCG(1, 2))
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[r.IntN(len(alphabet))]
	}
	return string(b)
}

func TestHostileValues(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := testContext(t)
	nc := tb.nc
	probe := newProber(t, ctx, tb)
	s := newStream(t, ctx, tb, "V", "v.>")
	publishN(t, ctx, tb.js, "v.a", 5)

	// Stream limits: nonsense is refused with a configuration error, or read as "no limit"
	// where nats-server reads it so, and an accepted stream still takes publishes.
	for _, c := range []struct {
		cfg  string
		want server.ErrorIdentifier // 0: accepted
	}{
		{`{"max_bytes":-5,"max_msgs":-9,"max_consumers":-3,"max_msgs_per_subject":-2,"max_msg_size":-7}`, 0},
		{`{"max_msgs":9223372036854775807,"max_bytes":9223372036854775807,"max_msgs_per_subject":9223372036854775807}`, 0},
		{`{"max_age":9223372036854775807,"duplicate_window":9223372036854775807}`, 0},
		{`{"duplicate_window":9223372036854775807}`, 0},
		{`{"max_age":1}`, server.JSStreamInvalidConfigF},
		{`{"max_age":-1}`, server.JSStreamInvalidConfigF},
		{`{"duplicate_window":-1}`, server.JSStreamInvalidConfigF},
		{`{"duplicate_window":1}`, server.JSStreamInvalidConfigF},
		{`{"max_age":60000000000,"duplicate_window":120000000000}`, server.JSStreamInvalidConfigF},
		{`{"num_replicas":-1}`, server.JSReplicasCountCannotBeNegative},
		{`{"num_replicas":100}`, server.JSStreamInvalidConfigF},
		{`{"max_msg_size":2147483647}`, server.JSStreamInvalidConfigF},
		{`{"retention":"workqueue","discard":"new","discard_new_per_subject":true}`, server.JSStreamInvalidConfigF},
		{fmt.Sprintf(`{"description":%q}`, strings.Repeat("d", server.JSMaxDescriptionLen+1)), server.JSStreamInvalidConfigF},
		{`{"description":"nul\u0000"}`, server.JSStreamInvalidConfigF},
		{`{"metadata":{"k\u0000":"v"}}`, server.JSStreamInvalidConfigF},
	} {
		cfg := decodeObject(t, c.cfg)
		cfg["name"], cfg["subjects"] = "ABS", []string{"abs.>"}
		body, _ := json.Marshal(cfg)
		r, raw := apiRequest(t, nc, "$JS.API.STREAM.CREATE.ABS", body)
		switch {
		case c.want == 0 && r.Error != nil:
			t.Errorf("stream with %s: %s", c.cfg, raw)
		case c.want != 0 && (r.Error == nil || r.Error.ErrCode != server.ApiErrors[c.want].ErrCode):
			t.Errorf("stream with %s: %s, want err_code %d", c.cfg, raw, server.ApiErrors[c.want].ErrCode)
		case c.want == 0:
			for i := range 3 {
				if _, err := tb.js.Publish(ctx, "abs.x", []byte("x"), jetstream.WithMsgID(fmt.Sprint(i))); err != nil {
					t.Errorf("publish to a stream with %s: %v", c.cfg, err)
				}
			}
			if err := tb.js.DeleteStream(ctx, "ABS"); err != nil {
				t.Fatal(err)
			}
		}
		probe.check("stream config " + c.cfg)
	}

	// Consumer configuration.
	for _, c := range []struct {
		cfg  string
		want server.ErrorIdentifier
	}{
		{`{"max_deliver":-5,"max_ack_pending":-7,"max_waiting":-3,"inactive_threshold":-1,"max_batch":-1,"max_bytes":-1,"max_expires":-1}`, 0},
		{`{"max_ack_pending":9223372036854775807,"max_waiting":2147483647,"ack_wait":9223372036854775807}`, 0},
		{`{"deliver_policy":"by_start_sequence","opt_start_seq":18446744073709551615}`, server.JSConsumerInvalidPolicyErrF},
		{`{"deliver_policy":"by_start_sequence","opt_start_seq":9223372036854775807}`, server.JSConsumerInvalidPolicyErrF},
		{`{"deliver_policy":"by_start_sequence","opt_start_seq":9223372036854775806}`, 0},
		{`{"deliver_policy":"by_start_time","opt_start_time":"9999-12-31T23:59:59Z"}`, 0},
		{`{"deliver_policy":"by_start_time","opt_start_time":"0001-01-01T00:00:00Z"}`, 0},
		{`{"ack_wait":-1}`, server.JSConsumerAckWaitNegativeErr},
		{`{"backoff":[-1]}`, server.JSConsumerBackOffNegativeErr},
		{`{"max_deliver":1,"backoff":[1000000000,2000000000]}`, server.JSConsumerMaxDeliverBackoffErr},
		{`{"max_expires":1}`, server.JSConsumerMaxRequestExpiresTooSmall},
		{`{"ack_policy":"none","deliver_policy":"last_per_subject"}`, server.JSConsumerInvalidPolicyErrF},
		{`{"filter_subject":"v.\u0000"}`, server.JSStreamInvalidConfigF},
		{`{"metadata":{"k":"v\u0000"}}`, server.JSStreamInvalidConfigF},
		{fmt.Sprintf(`{"metadata":{"k":%q}}`, strings.Repeat("m", server.JSMaxMetadataLen)), server.JSConsumerMetadataLengthErrF},
		{fmt.Sprintf(`{"description":%q}`, strings.Repeat("d", server.JSMaxDescriptionLen+1)), server.JSConsumerDescriptionTooLongErrF},
	} {
		cfg := decodeObject(t, c.cfg)
		cfg["durable_name"] = "ABS"
		body, _ := json.Marshal(map[string]any{"stream_name": "V", "config": cfg})
		r, raw := apiRequest(t, nc, "$JS.API.CONSUMER.CREATE.V.ABS", body)
		switch {
		case c.want == 0 && r.Error != nil:
			t.Errorf("consumer with %s: %s", c.cfg, raw)
		case c.want != 0 && (r.Error == nil || r.Error.ErrCode != server.ApiErrors[c.want].ErrCode):
			t.Errorf("consumer with %s: %s, want err_code %d", c.cfg, raw, server.ApiErrors[c.want].ErrCode)
		case c.want == 0:
			if got := pullStatusOf(t, nc, "V.ABS", `{"batch":10,"no_wait":true}`); got != "" && !strings.HasPrefix(got, "404 ") {
				t.Errorf("pull from a consumer with %s: %q", c.cfg, got)
			}
			wantAPIOK(t, nc, "$JS.API.CONSUMER.INFO.V.ABS", "")
			if err := s.DeleteConsumer(ctx, "ABS"); err != nil {
				t.Fatal(err)
			}
		}
		probe.check("consumer config " + c.cfg)
	}

	// Pull requests. A consumer that starts after the stream's messages has nothing to
	// deliver, so each request shows how it ends.
	if _, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "NEW", DeliverPolicy: jetstream.DeliverNewPolicy, AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	for body, want := range map[string]string{
		`{"batch":-5,"no_wait":true}`:                                                    "404 ",
		`{"batch":9223372036854775807,"no_wait":true}`:                                   "404 ",
		`{"batch":1,"expires":-1000000000}`:                                              "408 ",
		`{"batch":1,"expires":-9223372036854775808}`:                                     "408 ",
		`{"batch":1,"max_bytes":-1,"no_wait":true}`:                                      "404 ",
		`{"batch":1,"expires":2000000000,"idle_heartbeat":1}`:                            "400 ",
		`{"batch":1,"expires":1000,"idle_heartbeat":-5}`:                                 "408 ",
		`{"batch":1,"idle_heartbeat":9223372036854775807}`:                               "400 ",
		`{"batch":1,"expires":9223372036854775807,"idle_heartbeat":9223372036854775807}`: "400 ",
		`{"batch":1,"expires":-5,"idle_heartbeat":1000000000}`:                           "400 ",
		`{"batch":1,"priority":-1}`:                                                      "400 ",
		`{"batch":1,"min_pending":-1}`:                                                   "400 ",
		`-7`:                                                                             "", // a bare number is a batch size, as in nats-server: parks
	} {
		inbox := nats.NewInbox()
		sub, err := nc.SubscribeSync(inbox)
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.PublishRequest("$JS.API.CONSUMER.MSG.NEXT.V.NEW", inbox, []byte(body)); err != nil {
			t.Fatal(err)
		}
		m, err := sub.NextMsg(2 * time.Second)
		switch {
		case want == "" && err == nil:
			t.Errorf("pull with %q: answered %v, want it to wait", body, m.Header)
		case want != "" && err != nil:
			t.Errorf("pull with %q: %v, want %q", body, err, want)
		case want != "" && !strings.HasPrefix(m.Header.Get("Status")+" ", want):
			t.Errorf("pull with %q: %v %q, want %q", body, m.Header, m.Data, want)
		}
		_ = sub.Unsubscribe()
	}
	// A request that waits for ever, with a batch as large as can be, is delivered to.
	inbox := nats.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishRequest("$JS.API.CONSUMER.MSG.NEXT.V.NEW", inbox, []byte(`{"batch":9223372036854775807,"expires":9223372036854775807,"max_bytes":9223372036854775807}`)); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 5*time.Second, func() error {
		ci, err := s.Consumer(ctx, "NEW")
		if err != nil || ci.CachedInfo().NumWaiting != 1 {
			return fmt.Errorf("NEW waiting: %+v, %v", ci, err)
		}
		return nil
	})
	publishN(t, ctx, tb.js, "v.b", 2)
	for i := range 2 {
		if m, err := sub.NextMsg(5 * time.Second); err != nil || len(m.Data) == 0 {
			t.Fatalf("delivery %d to the largest request: %v, %v", i, m, err)
		}
	}
	_ = sub.Unsubscribe()
	probe.check("absurd pull requests")
}
