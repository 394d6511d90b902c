package bridge

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/bridge/ownership"
	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/internal/testwait"
)

// A client that may publish anywhere cannot pass a consumer request off as one another
// replica forwarded, past the server's permissions on $JS.API: without the deployment's
// seal, or with a stale one, the replica refuses it and counts it, by reason (and answers
// the stale one, which a replica did seal, with the refusal); with a fresh one it serves it.
func TestForwardedRequestsNeedTheSeal(t *testing.T) {
	t.Parallel()
	tb := setup(t, setupOpts{config: func(c *Config) { c.ReplicaName = "a" }})
	ctx := testContext(t)
	s := newStream(t, ctx, tb, "FWD", "fwd.>")
	if _, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C"}); err != nil {
		t.Fatal(err)
	}
	prefix := tb.bridge.fwd.Prefix("a")
	const api = "CONSUMER.DELETE.FWD.C"
	now := tb.db.PGTime(time.Now()).Unix()
	stale := &leaf.Msg{Reply: "_INBOX.fwd.stale"}
	// As replicas forwarded before they sealed: no replica subscribes that any more.
	plain, err := tb.nc.Request(prefix+api, nil, time.Second)
	if err == nil {
		t.Fatalf("unsealed request answered: %s", plain.Data)
	}
	forged := []string{
		prefix + "61.1.00." + api,
		prefix + "61." + strconv.FormatInt(now, 10) + ".0123456789abcdef0123456789abcdef." + api,
		prefix + tb.bridge.fwd.Seal(now-int64(2*ownership.ForwardMaxAge/time.Second), api, stale) + "." + api,
	}
	reasons := []string{ownership.RefusedSeal, ownership.RefusedSeal, ownership.RefusedClock}
	for i, subj := range forged {
		reply := "_INBOX.fwd.forged"
		if i == len(forged)-1 {
			reply = stale.Reply
		}
		sub, err := tb.nc.SubscribeSync(reply)
		if err != nil {
			t.Fatal(err)
		}
		if err := tb.nc.PublishMsg(&nats.Msg{Subject: subj, Reply: reply}); err != nil {
			t.Fatal(err)
		}
		testwait.For(t, 5*time.Second, func() error {
			refused := reasonCount(t, tb.reg, "jetgres_consumer_forwards_refused_total", ownership.RefusedSeal) +
				reasonCount(t, tb.reg, "jetgres_consumer_forwards_refused_total", ownership.RefusedClock)
			if refused < float64(i+1) {
				return errors.New("not refused yet")
			}
			return nil
		})
		if n := reasonCount(t, tb.reg, "jetgres_consumer_forwards_refused_total", reasons[i]); n < 1 {
			t.Fatalf("forged request %s not refused for its %s", subj, reasons[i])
		}
		// A replica's seal gone stale is answered with the refusal; a forgery is not.
		m, err := sub.NextMsg(100 * time.Millisecond)
		switch {
		case reasons[i] == ownership.RefusedClock && (err != nil || !strings.Contains(string(m.Data), ownership.ErrForwardRefused.Error())):
			t.Fatalf("stale request %s: answer %v, %v; want the refusal", subj, m, err)
		case reasons[i] == ownership.RefusedSeal && err == nil:
			t.Fatalf("forged request %s answered: %s", subj, m.Data)
		}
		_ = sub.Unsubscribe()
		if _, err := s.Consumer(ctx, "C"); err != nil {
			t.Fatalf("after forged request %s: %v", subj, err)
		}
	}
	// A sealed one, as a replica sends it, is served.
	reply := "_INBOX.fwd.sealed"
	sub, err := tb.nc.SubscribeSync(reply)
	if err != nil {
		t.Fatal(err)
	}
	m := &leaf.Msg{Reply: reply}
	if err := tb.nc.PublishMsg(&nats.Msg{Subject: prefix + tb.bridge.fwd.Seal(tb.db.PGTime(time.Now()).Unix(), api, m) + "." + api, Reply: reply}); err != nil {
		t.Fatal(err)
	}
	if _, err := sub.NextMsg(5 * time.Second); err != nil {
		t.Fatalf("sealed request not answered: %v", err)
	}
	if _, err := s.Consumer(ctx, "C"); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatalf("after the sealed delete: %v", err)
	}
}
