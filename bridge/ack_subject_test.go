package bridge

import (
	"testing"
	"time"
)

func TestAckSubjectRoundTrip(t *testing.T) {
	a := ackInfo{stream: "ORDERS", consumer: "C1", delivered: 2, sseq: 41, dseq: 7, ts: 1_700_000_000_123_456_789, pending: 12}
	s := string(appendAckSubject(nil, a))
	if want := "$JS.ACK.ORDERS.C1.2.41.7.1700000000123456789.12"; s != want {
		t.Fatalf("subject %q, want %q", s, want)
	}
	got, ok := parseAckSubject(s)
	if !ok || got != a {
		t.Fatalf("parsed %+v, %v; want %+v", got, ok, a)
	}
	v2, ok := parseAckSubject("$JS.ACK.hub.ACCHASH.ORDERS.C1.2.41.7.1700000000123456789.12.xyz")
	if !ok || v2 != a {
		t.Fatalf("v2 parsed %+v, %v; want %+v", v2, ok, a)
	}
	for _, bad := range []string{
		"", "$JS.ACK", "$JS.ACK.S.C.1.2.3.4", "$JS.ACK.S.C.1.2.3.4.5.6", "$JS.ACK.S.C.1.-2.3.4.5",
		"$JS.ACK..C.1.2.3.4.5", "$JS.API.S.C.1.2.3.4.5", "$JS.ACK.S.C.1.2.3.99999999999999999999.5",
		"$JS.ACK.S.C.1.2.3.4.+5",
	} {
		if _, ok := parseAckSubject(bad); ok {
			t.Errorf("parsed %q", bad)
		}
	}
}

func FuzzAckSubject(f *testing.F) {
	f.Add("$JS.ACK.ORDERS.C1.1.2.3.4.5")
	f.Add("$JS.ACK.d.h.S.C.1.2.3.4.5.x")
	f.Add("$JS.ACK.S.C.18446744073709551615.0.0.9223372036854775807.0")
	f.Fuzz(func(t *testing.T, s string) {
		a, ok := parseAckSubject(s)
		if !ok {
			return
		}
		if a.stream == "" || a.consumer == "" || a.ts < 0 {
			t.Fatalf("accepted %q as %+v", s, a)
		}
		again, ok := parseAckSubject(string(appendAckSubject(nil, a)))
		if !ok || again != a {
			t.Fatalf("%q: round trip gave %+v, %v from %+v", s, again, ok, a)
		}
	})
}

func TestDecodePullRequest(t *testing.T) {
	now := time.Unix(100, 0)
	cases := []struct {
		body      string
		batch     int
		noWait    bool
		expires   time.Duration
		maxBytes  int
		hb        time.Duration
		badStatus int
	}{
		{body: "", batch: 1},
		{body: "  ", batch: 1},
		{body: "10", batch: 10},
		{body: "nonsense", batch: 1},
		{body: `{"batch":5,"expires":30000000000,"idle_heartbeat":5000000000}`, batch: 5, expires: 30 * time.Second, hb: 5 * time.Second},
		{body: `{"batch":3,"no_wait":true}`, batch: 3, noWait: true},
		{body: `{"batch":2,"max_bytes":1024,"unknown":1}`, batch: 2, maxBytes: 1024},
		{body: `{"batch":1,"expires":1000000000,"idle_heartbeat":600000000}`, badStatus: 400},
		{body: `{"batch":1,"idle_heartbeat":1000}`, badStatus: 400},
		{body: `{"batch":`, badStatus: 400},
		{body: `{"batch":1,"priority":12}`, badStatus: 400},
		{body: `{"batch":1,"expires":1000000000,"idle_heartbeat":1}`, badStatus: 400},
		{body: `{"batch":1,"expires":9223372036854775807,"idle_heartbeat":9223372036854775807}`, badStatus: 400},
		{body: `{"batch":-4,"max_bytes":-1,"expires":-5}`, batch: 1, expires: -5},
	}
	for _, c := range cases {
		pr, bad := decodePullRequest([]byte(c.body), now)
		if c.badStatus != 0 {
			if bad == nil || bad.code != c.badStatus {
				t.Errorf("%q: status %v, want %d", c.body, bad, c.badStatus)
			}
			continue
		}
		if bad != nil {
			t.Errorf("%q: unexpected %v", c.body, bad)
			continue
		}
		var exp time.Time
		if c.expires != 0 {
			exp = now.Add(c.expires)
		}
		if pr.batch != c.batch || pr.noWait != c.noWait || !pr.expires.Equal(exp) || pr.maxBytes != c.maxBytes || pr.hb != c.hb {
			t.Errorf("%q: got %+v", c.body, pr)
		}
	}
}
