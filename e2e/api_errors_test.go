package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/testwait"
)

// apiErrorReply is what a JetStream API request is answered with: a JSON error, or for a direct
// get a bare status line.
type apiErrorReply struct {
	code, errCode int
	status        string
	desc          string
}

func (r apiErrorReply) String() string {
	if r.status != "" {
		return "status " + r.status
	}
	return fmt.Sprintf("code %d err_code %d %q", r.code, r.errCode, r.desc)
}

// apiReplyTo sends one API request and reads its first reply.
func apiReplyTo(t testing.TB, nc *nats.Conn, subject, body string) (apiErrorReply, error) {
	t.Helper()
	inbox := nats.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(subject, inbox, []byte(body)); err != nil {
		t.Fatal(err)
	}
	m, err := sub.NextMsg(20 * time.Second)
	if errors.Is(err, nats.ErrNoResponders) {
		return apiErrorReply{status: "503"}, nil // nats.go's reading of a bare 503 status line
	}
	if err != nil {
		return apiErrorReply{}, fmt.Errorf("%s: %w", subject, err)
	}
	if m.Header.Get("Nats-Sequence") != "" {
		return apiErrorReply{}, nil // a direct get's message
	}
	if st := m.Header.Get("Status"); st != "" && len(m.Data) == 0 {
		return apiErrorReply{status: st, desc: m.Header.Get("Description")}, nil
	}
	var resp struct {
		Error *struct {
			Code        int    `json:"code"`
			ErrCode     int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return apiErrorReply{}, fmt.Errorf("%s: %w in %q", subject, err, m.Data)
	}
	if resp.Error == nil {
		return apiErrorReply{}, nil
	}
	return apiErrorReply{code: resp.Error.Code, errCode: resp.Error.ErrCode, desc: resp.Error.Description}, nil
}

// TestDatabaseDownIsUnavailable takes PostgreSQL away under a running jetgres: lookups it
// cannot make are "JetStream system temporarily unavailable" (503, err_code 10008), which
// clients retry, never "stream not found" (10059) or "consumer not found" (10014), which
// they take as final; a direct get hears 503, as from a JetStream with no server for the
// stream. What memory holds is still answered: a direct get of a message in the tail cache.
// Once PostgreSQL is back, the same requests succeed.
func TestDatabaseDownIsUnavailable(t *testing.T) {
	db := startPGServer(t)
	j := startWithDatabase(t, db.dsn(), "--stmt-timeout", "2s", "--replica-name", "e2e-errs")
	nc, js := j.connect(t)
	ctx := t.Context()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ERRS", Subjects: []string{"errs.>"}, AllowDirect: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "errs.a", []byte("one")); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, "ERRS", jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	const inMemory = "direct get of a message in the tail cache"
	requests := []struct{ what, subject, body string }{
		{"stream info", "$JS.API.STREAM.INFO.ERRS", ""},
		{"stream info of a stream this process has not seen", "$JS.API.STREAM.INFO.OTHER", ""},
		{"consumer info", "$JS.API.CONSUMER.INFO.ERRS.C", ""},
		{"consumer create", "$JS.API.CONSUMER.CREATE.ERRS.D", `{"stream_name":"ERRS","config":{"durable_name":"D","ack_policy":"explicit"}}`},
		{"consumer info of a consumer this process does not serve", "$JS.API.CONSUMER.INFO.ERRS.E", ""},
		{"direct get of a subject memory does not hold", "$JS.API.DIRECT.GET.ERRS", `{"last_by_subj":"errs.b"}`},
		{inMemory, "$JS.API.DIRECT.GET.ERRS", `{"seq":1}`},
	}

	if err := db.stop(); err != nil {
		t.Fatal(err)
	}
	for _, r := range requests {
		got, err := apiReplyTo(t, nc, r.subject, r.body)
		if err != nil {
			t.Fatalf("%s with the database down: %v", r.what, err)
		}
		want := apiErrorReply{code: 503, errCode: 10008, desc: "JetStream system temporarily unavailable"}
		if strings.HasPrefix(r.subject, "$JS.API.DIRECT.") {
			want = apiErrorReply{status: "503"}
		}
		if r.what == inMemory {
			want = apiErrorReply{}
		}
		if got != want {
			t.Errorf("%s with the database down: %v, want %v", r.what, got, want)
		}
	}
	// What a client library makes of it: an API error it can retry on.
	_, err := js.Stream(ctx, "ERRS")
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != 10008 {
		t.Errorf("nats.go stream info with the database down: %v, want err_code 10008", err)
	}
	if t.Failed() {
		return
	}

	if err := db.start(); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 60*time.Second, func() error {
		for _, r := range requests {
			got, err := apiReplyTo(t, nc, r.subject, r.body)
			if err != nil {
				return err
			}
			var want apiErrorReply
			switch {
			case strings.HasSuffix(r.subject, ".OTHER"):
				want = apiErrorReply{code: 404, errCode: 10059, desc: "stream not found"}
			case strings.HasSuffix(r.subject, ".E"):
				want = apiErrorReply{code: 404, errCode: 10014, desc: "consumer not found"}
			case strings.Contains(r.body, "last_by_subj"):
				want = apiErrorReply{status: "404", desc: "Message Not Found"}
			}
			if got != want {
				return fmt.Errorf("%s with the database back: %v, want %v", r.what, got, want)
			}
		}
		return nil
	})
}

// TestUnsupportedRequests checks what jetgres answers to the JetStream API requests it does
// not serve: err_code 10036 with a description that names the request (as the nats CLI
// shows it), and a count per request in /metrics.
func TestUnsupportedRequests(t *testing.T) {
	j := startJetgres(t, options{})
	failOnRace(t, j)
	nc, js := j.connect(t)
	if _, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "UNSUP", Subjects: []string{"unsup.>"}}); err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct{ subject, name string }{
		{"$JS.API.CONSUMER.LEADER.STEPDOWN.UNSUP.C", "CONSUMER.LEADER.STEPDOWN"},
		{"$JS.API.CONSUMER.LEADER.STEPDOWN.UNSUP.C", "CONSUMER.LEADER.STEPDOWN"},
		{"$JS.API.STREAM.LEADER.STEPDOWN.UNSUP", "STREAM.LEADER.STEPDOWN"},
		{"$JS.API.META.LEADER.STEPDOWN", "META.LEADER.STEPDOWN"},
	} {
		got, err := apiReplyTo(t, nc, r.subject, "{}")
		if err != nil {
			t.Fatal(err)
		}
		want := apiErrorReply{code: 503, errCode: 10036, desc: r.name + " is not supported by jetgres"}
		if got != want {
			t.Errorf("%s: %v, want %v", r.subject, got, want)
		}
	}

	m, err := j.metrics()
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]float64{"CONSUMER.LEADER.STEPDOWN": 2, "STREAM.LEADER.STEPDOWN": 1} {
		key := `jetgres_api_unsupported_total{request="` + name + `"}`
		if got, ok := m[key]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", key, got, ok, want)
		}
	}
	if n := strings.Count(j.logs.String(), `request=CONSUMER.LEADER.STEPDOWN`); n != 1 {
		t.Errorf("CONSUMER.LEADER.STEPDOWN logged %d times, want once", n)
	}
}
