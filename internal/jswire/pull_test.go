package jswire

import (
	"testing"
	"time"
)

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
		{body: `{"batch":1,"priority":12}`, batch: 1},
		{body: `{"batch":1,"expires":1000000000,"idle_heartbeat":1}`, badStatus: 400},
		{body: `{"batch":1,"expires":9223372036854775807,"idle_heartbeat":9223372036854775807}`, badStatus: 400},
		{body: `{"batch":-4,"max_bytes":-1,"expires":-5}`, batch: 1, expires: -5},
	}
	for _, c := range cases {
		pr, bad := DecodePullRequest([]byte(c.body), now)
		if c.badStatus != 0 {
			if bad == nil || bad.Code != c.badStatus {
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
		if pr.Batch != c.batch || pr.NoWait != c.noWait || !pr.Expires.Equal(exp) || pr.MaxBytes != c.maxBytes || pr.Heartbeat != c.hb {
			t.Errorf("%q: got %+v", c.body, pr)
		}
	}
}

// A request's priority fields are carried to the consumer, which alone can judge them; a
// request that is not JSON has none, as nats-server tells them apart.
func TestDecodePullRequestPriorityGroup(t *testing.T) {
	pr, bad := DecodePullRequest([]byte(`{"batch":2,"group":"A","min_pending":3,"min_ack_pending":4,"id":"pin","priority":12}`), time.Unix(100, 0))
	if bad != nil || pr.Group == nil {
		t.Fatalf("decoded %+v, %v", pr, bad)
	}
	if g := *pr.Group; g.Group != "A" || g.MinPending != 3 || g.MinAckPending != 4 || g.Id != "pin" || g.Priority != 12 {
		t.Fatalf("group %+v", g)
	}
	if pr, _ := DecodePullRequest([]byte("2"), time.Unix(100, 0)); pr.Group != nil {
		t.Fatalf("a batch size alone decoded a group: %+v", pr.Group)
	}
}
