package ownership

import (
	"testing"
	"time"

	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/internal/clock/clocktest"
)

// A request on this replica's forwarding subjects is taken only with a fresh seal made with
// the deployment's secret over what the replica acts on; anything else is refused.
func TestReceivedChecksTheSeal(t *testing.T) {
	clock := clocktest.New()
	f := NewForwarder(ForwarderConfig{Clock: clock, ReplicaName: "a"})
	f.key = []byte("the deployment's secret")
	const api = "CONSUMER.DELETE.S.C"
	sealed := func(at time.Time, m *leaf.Msg) *leaf.Msg {
		m.Subject = f.Prefix("a") + f.Seal(at.Unix(), api, m) + "." + api
		return m
	}

	if forwarded, ok := f.Received(&leaf.Msg{Subject: "$JS.API." + api}); forwarded || !ok {
		t.Fatalf("a request sent to $JS.API: forwarded %v, ok %v; want false, true", forwarded, ok)
	}
	m := sealed(clock.Now(), &leaf.Msg{Reply: "_INBOX.1", Data: []byte("{}")})
	if forwarded, ok := f.Received(m); !forwarded || !ok || m.Subject != "$JS.API."+api {
		t.Fatalf("a sealed request: forwarded %v, ok %v, subject %q; want it taken as $JS.API.%s", forwarded, ok, m.Subject, api)
	}

	refused := map[string]*leaf.Msg{
		"stale":           sealed(clock.Now().Add(-2*ForwardMaxAge), &leaf.Msg{Reply: "_INBOX.2"}),
		"from the future": sealed(clock.Now().Add(2*ForwardMaxAge), &leaf.Msg{Reply: "_INBOX.3"}),
		"unsealed":        {Subject: f.Prefix("a") + api},
		"another reply": func() *leaf.Msg {
			m := sealed(clock.Now(), &leaf.Msg{Reply: "_INBOX.4"})
			m.Reply = "_INBOX.5"
			return m
		}(),
		"another body": func() *leaf.Msg {
			m := sealed(clock.Now(), &leaf.Msg{Data: []byte("a")})
			m.Data = []byte("b")
			return m
		}(),
	}
	for what, m := range refused {
		if forwarded, ok := f.Received(m); !forwarded || ok {
			t.Errorf("%s request: forwarded %v, ok %v; want true, false", what, forwarded, ok)
		}
	}

	other := NewForwarder(ForwarderConfig{Clock: clock, ReplicaName: "a"})
	other.key = []byte("another deployment's secret")
	if _, ok := other.Received(sealed(clock.Now(), &leaf.Msg{})); ok {
		t.Error("a request sealed with another secret was taken")
	}
}
