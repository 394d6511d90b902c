package jswire

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Two filters of one consumer may not overlap where one covers the other; filters that
// only cross (each matches subjects the other does not) are allowed, as in nats-server.
func TestConsumerFilterOverlap(t *testing.T) {
	overlapCode := server.NewJSConsumerOverlappingSubjectFiltersError().ErrCode
	scfg := server.StreamConfig{Name: "S", Subjects: []string{">"}, Replicas: 1}
	for _, c := range []struct {
		a, b    string
		overlap bool
	}{
		{"a.b", "a.c", false},
		{"a.b", "a.b.c", false},
		{"a.*", "a.b", true},
		{"a.b", "a.*", true},
		{"a.*", "a.*.c", false},
		{"a.>", "a.b", true},
		{"a.>", "a.b.c.d", true},
		{"a.>", "a", false},
		{"a.>", "a.*", true},
		{"a.*", "a.>", true},
		{"*.b", "a.*", false}, // they cross at a.b, but each matches what the other does not
		{"a.*.c", "a.b.*", false},
		{"*.*", "a.b", true},
		{"*.*", "a.b.c", false},
		{">", "a", true},
		{"*", "a.b", false},
		{"a.*.>", "a.b.c", true},
		{"a.*.>", "a.b", false},
		{"a.b.>", "a.*.>", true},
	} {
		cfg := server.ConsumerConfig{Durable: "C", AckPolicy: server.AckExplicit, FilterSubjects: []string{c.a, c.b}}
		_, e := CheckConsumerConfig(cfg, &scfg)
		switch {
		case c.overlap && (e == nil || e.ErrCode != overlapCode):
			t.Errorf("filters %q and %q: %v, want them refused as overlapping", c.a, c.b, e)
		case !c.overlap && e != nil:
			t.Errorf("filters %q and %q: %v, want them accepted", c.a, c.b, e)
		}
	}
}

// Push consumers get nats-server's defaults (no max_waiting) and its refusals, in its order.
func TestPushConsumerConfig(t *testing.T) {
	scfg := server.StreamConfig{Name: "S", Subjects: []string{"orders.>"}, Replicas: 1}
	push := func(mod func(*server.ConsumerConfig)) server.ConsumerConfig {
		cfg := server.ConsumerConfig{Durable: "C", DeliverSubject: "deliver.c", AckPolicy: server.AckExplicit}
		mod(&cfg)
		return cfg
	}
	pull := func(mod func(*server.ConsumerConfig)) server.ConsumerConfig {
		cfg := server.ConsumerConfig{Durable: "C", AckPolicy: server.AckExplicit}
		mod(&cfg)
		return cfg
	}
	for _, c := range []struct {
		name string
		cfg  server.ConsumerConfig
		want *server.ApiError // nil: accepted
	}{
		{"plain", push(func(*server.ConsumerConfig) {}), nil},
		{"every push option", push(func(c *server.ConsumerConfig) {
			c.DeliverGroup, c.FlowControl, c.Heartbeat, c.RateLimit, c.HeadersOnly = "g", true, 5*time.Second, 1<<20, true
		}), nil},
		{"ordered", push(func(c *server.ConsumerConfig) {
			c.Durable, c.AckPolicy, c.MaxDeliver, c.FlowControl, c.Heartbeat = "", server.AckNone, 1, true, 5*time.Second
			c.MemoryStorage, c.Replicas, c.InactiveThreshold = true, 1, 5*time.Minute
			c.DeliverPolicy, c.OptStartSeq = server.DeliverByStartSequence, 7
		}), nil},
		{"max_request_* on push", push(func(c *server.ConsumerConfig) { c.MaxRequestBatch, c.MaxRequestExpires = 5, time.Second }), nil},
		{"deliver_group on pull", pull(func(c *server.ConsumerConfig) { c.DeliverGroup = "g" }), nil},
		{"negative heartbeat on pull", pull(func(c *server.ConsumerConfig) { c.Heartbeat = -1 }), nil},
		{"wildcard", push(func(c *server.ConsumerConfig) { c.DeliverSubject = "deliver.*" }), server.NewJSConsumerDeliverToWildcardsError()},
		{"invalid", push(func(c *server.ConsumerConfig) { c.DeliverSubject = "deliver..c" }), server.NewJSConsumerInvalidDeliverSubjectError()},
		{"reserved", push(func(c *server.ConsumerConfig) { c.DeliverSubject = "$JS.ACK.x" }), server.NewJSConsumerInvalidDeliverSubjectError()},
		{"reserved domain API", push(func(c *server.ConsumerConfig) { c.DeliverSubject = "$JS.hub.API.x" }), server.NewJSConsumerInvalidDeliverSubjectError()},
		{"cycle", push(func(c *server.ConsumerConfig) { c.DeliverSubject = "orders.new" }), server.NewJSConsumerDeliverCycleError()},
		{"max_waiting", push(func(c *server.ConsumerConfig) { c.MaxWaiting = 10 }), server.NewJSConsumerPushMaxWaitingError()},
		{"ack none with max_ack_pending", push(func(c *server.ConsumerConfig) { c.AckPolicy, c.MaxAckPending = server.AckNone, 10 }), server.NewJSConsumerMaxPendingAckPolicyRequiredError()},
		{"small heartbeat", push(func(c *server.ConsumerConfig) { c.Heartbeat = 50 * time.Millisecond }), server.NewJSConsumerSmallHeartbeatError()},
		{"flow control without heartbeat", push(func(c *server.ConsumerConfig) { c.FlowControl = true }), server.NewJSConsumerWithFlowControlNeedsHeartbeatsError()},
		{"rate limit on pull", pull(func(c *server.ConsumerConfig) { c.RateLimit = 1 }), server.NewJSConsumerPullWithRateLimitError()},
		{"heartbeat on pull", pull(func(c *server.ConsumerConfig) { c.Heartbeat = time.Second }), server.NewJSConsumerHBRequiresPushError()},
		{"flow control on pull", pull(func(c *server.ConsumerConfig) { c.FlowControl = true }), server.NewJSConsumerFCRequiresPushError()},
		{"ack flow control on pull", pull(func(c *server.ConsumerConfig) { c.AckPolicy = server.AckFlowControl }), server.NewJSConsumerAckFCRequiresPushError()},
		{"ack flow control with max_deliver", push(func(c *server.ConsumerConfig) { c.AckPolicy, c.MaxDeliver = server.AckFlowControl, 3 }), server.NewJSConsumerAckFCRequiresNoMaxDeliverError()},
		{"ack flow control with ack wait", push(func(c *server.ConsumerConfig) { c.AckPolicy, c.AckWait = server.AckFlowControl, time.Second }), server.NewJSConsumerAckFCRequiresNoAckWaitError()},
	} {
		got, e := CheckConsumerConfig(c.cfg, &scfg)
		switch {
		case c.want == nil && e != nil:
			t.Errorf("%s: refused: %v", c.name, e)
		case c.want != nil && (e == nil || e.ErrCode != c.want.ErrCode || e.Description != c.want.Description):
			t.Errorf("%s: got %v, want %v", c.name, e, c.want)
		case e == nil && got.DeliverSubject != "" && got.MaxWaiting != 0:
			t.Errorf("%s: push consumer defaulted max_waiting to %d", c.name, got.MaxWaiting)
		case e == nil && got.DeliverSubject == "" && got.MaxWaiting != consumerMaxWaitingDefault:
			t.Errorf("%s: pull consumer got max_waiting %d", c.name, got.MaxWaiting)
		}
	}

	// A valid flow_control ack policy, as stream sourcing asks for it, gets the defaults it
	// implies: flow control, a 1s heartbeat, no ack wait and the default max_ack_pending.
	got, e := CheckConsumerConfig(push(func(c *server.ConsumerConfig) { c.AckPolicy = server.AckFlowControl }), &scfg)
	if e != nil || !got.FlowControl || got.Heartbeat != time.Second || got.AckWait != 0 || got.MaxAckPending != consumerMaxAckPendingDefault {
		t.Errorf("flow_control ack policy: %+v, %v", got, e)
	}
}

// Updates keep a consumer's kind and its flow control, and move a push consumer only off a
// deliver subject nobody listens on.
func TestPushConsumerUpdate(t *testing.T) {
	pull := server.ConsumerConfig{Durable: "C", AckPolicy: server.AckExplicit, MaxWaiting: 512}
	push := server.ConsumerConfig{Durable: "C", AckPolicy: server.AckExplicit, DeliverSubject: "d.1"}
	with := func(c server.ConsumerConfig, mod func(*server.ConsumerConfig)) *server.ConsumerConfig {
		mod(&c)
		return &c
	}
	listening := func(subject string) bool { return subject == "d.1" }
	nobody := func(string) bool { return false }
	for _, c := range []struct {
		name     string
		old, cfg *server.ConsumerConfig
		interest func(string) bool
		want     string
	}{
		{"pull to push", &pull, with(pull, func(c *server.ConsumerConfig) { c.DeliverSubject, c.MaxWaiting = "d.1", 0 }), nobody, "can not update pull consumer to push based"},
		{"push to pull", &push, with(push, func(c *server.ConsumerConfig) { c.DeliverSubject, c.MaxWaiting = "", 512 }), nobody, "can not update push consumer to pull based"},
		{"heartbeat", &push, with(push, func(c *server.ConsumerConfig) { c.Heartbeat = time.Second }), nobody, "heart beats can not be updated"},
		{"flow control", &push, with(push, func(c *server.ConsumerConfig) { c.FlowControl = true }), nobody, "flow control can not be updated"},
		{"bound deliver subject", &push, with(push, func(c *server.ConsumerConfig) { c.DeliverSubject = "d.2" }), listening, server.NewJSConsumerNameExistError().Error()},
		{"free deliver subject", &push, with(push, func(c *server.ConsumerConfig) { c.DeliverSubject = "d.2" }), nobody, ""},
		{"deliver group", &push, with(push, func(c *server.ConsumerConfig) { c.DeliverGroup = "g" }), listening, ""},
	} {
		err := CheckConsumerUpdate(c.old, c.cfg, c.interest)
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}
}

// A consumer without filters wants every subject; one with filters, the subjects one of
// them matches, wildcards as nats-server routes them.
func TestFiltersMatch(t *testing.T) {
	for _, c := range []struct {
		filters []string
		subject string
		want    bool
	}{
		{nil, "a.b", true},
		{[]string{"a.b"}, "a.b", true},
		{[]string{"a.b"}, "a.c", false},
		{[]string{"a.c", "a.*"}, "a.b", true},
		{[]string{"a.*"}, "a.b.c", false},
		{[]string{"x", "a.>"}, "a.b.c", true},
		{[]string{"a.>"}, "a", false},
		{[]string{"*.b"}, "a.b", true},
	} {
		if got := FiltersMatch(c.filters, c.subject); got != c.want {
			t.Errorf("FiltersMatch(%q, %q) = %v, want %v", c.filters, c.subject, got, c.want)
		}
	}
}
