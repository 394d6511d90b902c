package bridge

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/testwait"
)

// Streams with allow_msg_schedules are created, updated and refused as nats-server does
// them, and a schedule's headers are checked as it checks them: the same PubAck bytes for
// every publish, stored or refused.
func TestScheduleHeadersTwin(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	var code [2]jetstream.ErrorCode
	for side, js := range tw.js {
		_, err := js.CreateStream(tw.ctx, jetstream.StreamConfig{Name: "BAD", Subjects: []string{"bad.>"}, AllowMsgSchedules: true, Discard: jetstream.DiscardNew})
		code[side] = errCode(t, side, err)
	}
	if code[ours] != code[theirs] || code[ours] == 0 {
		t.Fatalf("schedules with discard new: jetgres %d, jetstream %d", code[ours], code[theirs])
	}
	tw.createStream(jetstream.StreamConfig{Name: "SH", Subjects: []string{"sh.>"}, AllowMsgSchedules: true})
	tw.compareAll("created with schedules")
	for side, js := range tw.js {
		_, err := js.UpdateStream(tw.ctx, jetstream.StreamConfig{Name: "SH", Subjects: []string{"sh.>"}, AllowRollup: true})
		code[side] = errCode(t, side, err)
	}
	if code[ours] != code[theirs] || code[ours] == 0 {
		t.Fatalf("turning schedules off: jetgres %d, jetstream %d", code[ours], code[theirs])
	}

	in := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	sched := func(kv ...string) nats.Header {
		h := nats.Header{}
		for i := 0; i < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	for _, c := range []struct {
		name, subject string
		hdr           nats.Header
	}{
		{"every", "sh.s.every", sched("Nats-Schedule", "@every 1m", "Nats-Schedule-Target", "sh.t")},
		{"at", "sh.s.at", sched("Nats-Schedule", "@at "+in, "Nats-Schedule-Target", "sh.t")},
		{"cron", "sh.s.cron", sched("Nats-Schedule", "0 30 9 * * mon-fri", "Nats-Schedule-Target", "sh.t")},
		{"cron in a zone", "sh.s.zone", sched("Nats-Schedule", "0 0 9 1 jan *", "Nats-Schedule-Target", "sh.t", "Nats-Schedule-Time-Zone", "Europe/Paris")},
		{"hourly", "sh.s.hourly", sched("Nats-Schedule", "@hourly", "Nats-Schedule-Target", "sh.t")},
		{"with source", "sh.s.src", sched("Nats-Schedule", "@every 1m", "Nats-Schedule-Target", "sh.t", "Nats-Schedule-Source", "sh.src")},
		{"rollup sub", "sh.s.rollup", sched("Nats-Schedule", "@every 1m", "Nats-Schedule-Target", "sh.t", "Nats-Rollup", "sub", "Nats-Schedule-Rollup", "sub")},
		{"pattern", "sh.s.x", sched("Nats-Schedule", "whenever", "Nats-Schedule-Target", "sh.t")},
		{"every under a second", "sh.s.x", sched("Nats-Schedule", "@every 500ms", "Nats-Schedule-Target", "sh.t")},
		{"at in a zone", "sh.s.x", sched("Nats-Schedule", "@at "+in, "Nats-Schedule-Target", "sh.t", "Nats-Schedule-Time-Zone", "Europe/Paris")},
		{"cron of five fields", "sh.s.x", sched("Nats-Schedule", "0 9 * * *", "Nats-Schedule-Target", "sh.t")},
		{"cron out of range", "sh.s.x", sched("Nats-Schedule", "61 * * * * *", "Nats-Schedule-Target", "sh.t")},
		{"cron that never matches", "sh.s.x", sched("Nats-Schedule", "0 0 0 30 feb *", "Nats-Schedule-Target", "sh.t")},
		{"zone unknown", "sh.s.x", sched("Nats-Schedule", "@hourly", "Nats-Schedule-Target", "sh.t", "Nats-Schedule-Time-Zone", "Nowhere/Town")},
		{"ttl without message ttls", "sh.s.x", sched("Nats-Schedule", "@hourly", "Nats-Schedule-Target", "sh.t", "Nats-Schedule-TTL", "1m")},
		{"ttl invalid", "sh.s.x", sched("Nats-Schedule", "@hourly", "Nats-Schedule-Target", "sh.t", "Nats-Schedule-TTL", "soon")},
		{"schedule rollup all", "sh.s.x", sched("Nats-Schedule", "@hourly", "Nats-Schedule-Target", "sh.t", "Nats-Schedule-Rollup", "all")},
		{"no target", "sh.s.x", sched("Nats-Schedule", "@hourly")},
		{"target is the subject", "sh.s.x", sched("Nats-Schedule", "@hourly", "Nats-Schedule-Target", "sh.s.x")},
		{"target a wildcard", "sh.s.x", sched("Nats-Schedule", "@hourly", "Nats-Schedule-Target", "sh.*")},
		{"target outside the stream", "sh.s.x", sched("Nats-Schedule", "@hourly", "Nats-Schedule-Target", "elsewhere")},
		{"source is the target", "sh.s.x", sched("Nats-Schedule", "@hourly", "Nats-Schedule-Target", "sh.t", "Nats-Schedule-Source", "sh.t")},
		{"source outside the stream", "sh.s.x", sched("Nats-Schedule", "@hourly", "Nats-Schedule-Target", "sh.t", "Nats-Schedule-Source", "elsewhere")},
		{"rollup all", "sh.s.x", sched("Nats-Schedule", "@hourly", "Nats-Schedule-Target", "sh.t", "Nats-Rollup", "all")},
		{"scheduler alone", "sh.s.x", sched("Nats-Scheduler", "sh.s.every")},
		{"next not purge", "sh.s.x", sched("Nats-Schedule-Next", "later", "Nats-Scheduler", "sh.s.every")},
		{"purge a schedule", "sh.p", sched("Nats-Schedule-Next", "purge", "Nats-Scheduler", "sh.s.cron")},
	} {
		tw.pubRaw(c.name, &nats.Msg{Subject: c.subject, Header: c.hdr, Data: []byte(c.name)})
	}
	tw.compareAll("schedules published")
	for side, js := range tw.js {
		s, err := js.Stream(tw.ctx, "SH")
		if err != nil {
			t.Fatal(err)
		}
		m, err := s.GetLastMsgForSubject(tw.ctx, "sh.s.every")
		if err != nil || m.Header.Get("Nats-Rollup") != "sub" {
			t.Fatalf("%s: the schedule as stored: %+v %v", sideName[side], m, err)
		}
	}
	// The purge of sh.s.cron takes the schedule with it, on both sides.
	tw.settle("SH", func(st jetstream.StreamState) bool { return st.Msgs == 7 })
}

// A schedule fires on both sides with the same message: its data, or its source's, and the
// headers nats-server gives it; a one-shot's schedule is purged.
func TestScheduleFiresTwin(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "SF", Subjects: []string{"sf.>"}, AllowMsgSchedules: true, AllowMsgTTL: true})
	src := &nats.Msg{Subject: "sf.src", Header: nats.Header{"From-Source": {"yes"}}, Data: []byte("source data")}
	tw.pubRaw("source", src)
	at := time.Now().Add(2 * time.Second).UTC().Format(time.RFC3339)
	for _, c := range []struct{ subject, target, source string }{{"sf.s.plain", "sf.t.plain", ""}, {"sf.s.src", "sf.t.src", "sf.src"}} {
		h := nats.Header{"Nats-Schedule": {"@at " + at}, "Nats-Schedule-Target": {c.target}, "Nats-Schedule-TTL": {"1h"},
			"Nats-Schedule-Rollup": {"sub"}, "Nats-Msg-Id": {c.subject}, "Nats-Expected-Last-Subject-Sequence": {"0"}, "Custom": {"kept"}}
		if c.source != "" {
			h.Set("Nats-Schedule-Source", c.source)
		}
		tw.pubRaw(c.subject, &nats.Msg{Subject: c.subject, Header: h, Data: []byte("schedule data")})
	}
	for _, target := range []string{"sf.t.plain", "sf.t.src"} {
		var got [2]string
		testwait.For(t, 15*time.Second, func() error {
			for side, js := range tw.js {
				s, err := js.Stream(tw.ctx, "SF")
				if err != nil {
					return err
				}
				m, err := s.GetLastMsgForSubject(tw.ctx, target)
				if err != nil {
					return fmt.Errorf("%s: %s: %w", sideName[side], target, err)
				}
				got[side] = describe(m)
			}
			return nil
		})
		if got[ours] != got[theirs] {
			t.Errorf("%s:\njetgres   %s\njetstream %s", target, got[ours], got[theirs])
		}
	}
	// Both schedules purged: the source and the two produced messages are left.
	tw.settle("SF", func(st jetstream.StreamState) bool { return st.Msgs == 3 })
}

// describe is a stored message as the twins compare it: subject, headers in key order, data.
func describe(m *jetstream.RawStreamMsg) string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s", m.Subject)
	for _, k := range slices.Sorted(maps.Keys(m.Header)) {
		fmt.Fprintf(&b, " %s=%v", k, m.Header[k])
	}
	fmt.Fprintf(&b, " data=%q", m.Data)
	return b.String()
}

// A schedule ends when a message without one is stored on its subject, and a newer schedule
// replaces an older one: on both sides only the newer fires, and the ended one never does.
func TestScheduleReplacedTwin(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "SP", Subjects: []string{"sp.>"}, AllowMsgSchedules: true})
	at := func(d time.Duration) string { return "@at " + time.Now().Add(d).UTC().Format(time.RFC3339) }
	tw.pubRaw("ended", &nats.Msg{Subject: "sp.s.ended", Header: nats.Header{"Nats-Schedule": {at(2 * time.Second)}, "Nats-Schedule-Target": {"sp.t.ended"}}})
	tw.pubRaw("end it", &nats.Msg{Subject: "sp.s.ended", Data: []byte("plain")})
	tw.pubRaw("replaced", &nats.Msg{Subject: "sp.s.repl", Header: nats.Header{"Nats-Schedule": {at(time.Hour)}, "Nats-Schedule-Target": {"sp.t.old"}}})
	tw.pubRaw("replacement", &nats.Msg{Subject: "sp.s.repl", Header: nats.Header{"Nats-Schedule": {at(2 * time.Second)}, "Nats-Schedule-Target": {"sp.t.new"}}})
	// sp.s.ended keeps both its messages; sp.s.repl's schedule fired and went. The ended
	// schedule was due with the other: had it fired, it would have by then.
	var got [2]map[string]uint64
	testwait.For(t, 15*time.Second, func() error {
		for side, js := range tw.js {
			s, err := js.Stream(tw.ctx, "SP")
			if err != nil {
				return err
			}
			info, err := s.Info(tw.ctx, jetstream.WithSubjectFilter("sp.>"))
			if err != nil {
				return err
			}
			if got[side] = info.State.Subjects; got[side]["sp.t.new"] != 1 || got[side]["sp.s.repl"] != 0 {
				return fmt.Errorf("%s: subjects %v", sideName[side], got[side])
			}
		}
		return nil
	})
	want := map[string]uint64{"sp.s.ended": 2, "sp.t.new": 1}
	for side := range got {
		if !maps.Equal(got[side], want) {
			t.Errorf("%s: subjects %v, want %v", sideName[side], got[side], want)
		}
	}
}

// A client's Nats-Schedule-Next: purge is checked against its Nats-Scheduler subject's last
// message as nats-server 2.15 checks it: refused (10212) when that is no schedule, stored
// when the subject holds none or a schedule, which it then purges; the same PubAck bytes on
// both sides.
func TestSchedulePurgeCheckedTwin(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createStream(jetstream.StreamConfig{Name: "SQ", Subjects: []string{"sq.>"}, AllowMsgSchedules: true})
	in := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	purge := func(scheduler string) *nats.Msg {
		return &nats.Msg{Subject: "sq.p", Header: nats.Header{"Nats-Schedule-Next": {"purge"}, "Nats-Scheduler": {scheduler}}}
	}
	tw.pubRaw("plain", &nats.Msg{Subject: "sq.plain", Data: []byte("plain")})
	tw.pubRaw("schedule", &nats.Msg{Subject: "sq.s", Header: nats.Header{"Nats-Schedule": {"@at " + in}, "Nats-Schedule-Target": {"sq.t"}}})
	if got := tw.pubRaw("purge of a plain message", purge("sq.plain")); !bytes.Contains(got, []byte("10212")) {
		t.Fatalf("purge of a plain message answered %s, want error 10212", got)
	}
	tw.pubRaw("purge of a subject without messages", purge("sq.none"))
	tw.pubRaw("purge of a schedule", purge("sq.s"))
	tw.pubRaw("purge of a purged schedule", purge("sq.s"))
	tw.compareAll("purges published")
	// sq.plain and the three purges are left: the schedule went with the first of its.
	tw.settle("SQ", func(st jetstream.StreamState) bool { return st.Msgs == 4 })
}
