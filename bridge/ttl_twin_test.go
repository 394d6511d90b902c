package bridge

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/testwait"
)

// The twin's JetStream expires on its own clock, so these tests run both sides on real
// time with TTLs of a second or two and wait for both with deadlines; the same expiry on
// jetgres's injected clock is in ttl_test.go.

// createBoth creates a stream on both sides and fails unless the configs they report
// agree on what message TTLs and delete markers change.
func (tw *twin) createBoth(cfg jetstream.StreamConfig) {
	tw.t.Helper()
	var got [2]string
	for side, js := range tw.js {
		s, err := js.CreateStream(tw.ctx, cfg)
		if err != nil {
			tw.t.Fatalf("%s: create stream: %v", sideName[side], err)
		}
		c := s.CachedInfo().Config
		got[side] = fmt.Sprintf("allow_msg_ttl=%v subject_delete_marker_ttl=%v allow_rollup=%v deny_purge=%v required_level=%s",
			c.AllowMsgTTL, c.SubjectDeleteMarkerTTL, c.AllowRollup, c.DenyPurge, c.Metadata["_nats.req.level"])
	}
	if got[ours] != got[theirs] {
		tw.t.Fatalf("create %s:\njetgres   %s\njetstream %s", cfg.Name, got[ours], got[theirs])
	}
	tw.streams = append(tw.streams, cfg.Name)
	tw.compareAll("create stream " + cfg.Name)
}

// createErr creates a stream on both sides and fails unless both refuse it with the same
// err_code.
func (tw *twin) createErr(cfg jetstream.StreamConfig) jetstream.ErrorCode {
	tw.t.Helper()
	var code [2]jetstream.ErrorCode
	for side, js := range tw.js {
		_, err := js.CreateStream(tw.ctx, cfg)
		code[side] = errCode(tw.t, side, err)
	}
	if code[ours] != code[theirs] || code[ours] == 0 {
		tw.t.Fatalf("create %s: jetgres err_code %d, jetstream %d", cfg.Name, code[ours], code[theirs])
	}
	return code[ours]
}

// storedAll reads every message the stream holds on each side, by direct get of each
// sequence, as "seq subject headers data" lines, and fails unless both hold the same.
func (tw *twin) storedAll(stream string) []string {
	tw.t.Helper()
	var got [2][]string
	testwait.For(tw.t, 10*time.Second, func() error {
		for side, js := range tw.js {
			s, err := js.Stream(tw.ctx, stream)
			if err != nil {
				return err
			}
			st := s.CachedInfo().State
			got[side] = got[side][:0]
			for seq := st.FirstSeq; seq <= st.LastSeq && st.Msgs > 0; seq++ {
				m, err := s.GetMsg(tw.ctx, seq)
				if errors.Is(err, jetstream.ErrMsgNotFound) {
					continue
				}
				if err != nil {
					return fmt.Errorf("%s: get %d: %w", sideName[side], seq, err)
				}
				got[side] = append(got[side], fmt.Sprintf("%d %s %s %q", m.Sequence, m.Subject, headerText(m.Header), m.Data))
			}
		}
		if !slices.Equal(got[ours], got[theirs]) {
			return fmt.Errorf("stream %s holds:\njetgres   %q\njetstream %q", stream, got[ours], got[theirs])
		}
		return nil
	})
	return got[ours]
}

// headerText is a header's keys and values in order, without what only a direct get adds.
func headerText(h nats.Header) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(h)) {
		if strings.HasPrefix(k, "Nats-Stream") || k == "Nats-Sequence" || k == "Nats-Time-Stamp" || k == "Nats-Subject" || k == "Nats-Num-Pending" || k == "Nats-Last-Sequence" {
			continue
		}
		fmt.Fprintf(&b, "%s=%s;", k, strings.Join(h[k], ","))
	}
	return b.String()
}

// pubTTL publishes with a Nats-TTL on both sides and compares the answers byte for byte.
func (tw *twin) pubTTL(subject, ttl string) []byte {
	tw.t.Helper()
	ans := tw.pubRaw(subject+" ttl "+ttl, &nats.Msg{Subject: subject, Header: nats.Header{"Nats-TTL": {ttl}}, Data: []byte(subject)})
	tw.compareAll("publish to " + subject)
	return ans
}

// Stream configs with message TTLs and delete markers: what nats-server fills in, and what
// it refuses, on create and on update.
func TestTTLConfigTwin(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createBoth(jetstream.StreamConfig{Name: "TTLA", Subjects: []string{"ttla.>"}, AllowMsgTTL: true})
	// Markers turn message TTLs and roll-ups on, and purges back on.
	tw.createBoth(jetstream.StreamConfig{Name: "TTLB", Subjects: []string{"ttlb.>"}, SubjectDeleteMarkerTTL: time.Minute, DenyPurge: true})
	for _, cfg := range []jetstream.StreamConfig{
		{Name: "TTLC", Subjects: []string{"ttlc"}, SubjectDeleteMarkerTTL: 500 * time.Millisecond},
		{Name: "TTLD", Subjects: []string{"ttld"}, SubjectDeleteMarkerTTL: -time.Second},
	} {
		if code := tw.createErr(cfg); code != errStreamInvalidConfig {
			t.Fatalf("%s: err_code %d", cfg.Name, code)
		}
	}
	var code [2]jetstream.ErrorCode
	for side, js := range tw.js {
		_, err := js.UpdateStream(tw.ctx, jetstream.StreamConfig{Name: "TTLA", Subjects: []string{"ttla.>"}})
		code[side] = errCode(t, side, err)
	}
	if code[ours] != code[theirs] || code[ours] != errStreamInvalidConfig {
		t.Fatalf("turning TTLs off: jetgres err_code %d, jetstream %d", code[ours], code[theirs])
	}
	tw.updateStream(jetstream.StreamConfig{Name: "TTLA", Subjects: []string{"ttla.>"}, AllowMsgTTL: true, SubjectDeleteMarkerTTL: time.Minute})
}

// Messages expire by their Nats-TTL on both sides alike: the PubAcks, a TTL under a second
// refused, "never" outliving max_age, and what is left, headers included.
func TestTTLExpiryTwin(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createBoth(jetstream.StreamConfig{Name: "EXP", Subjects: []string{"exp.>"}, AllowMsgTTL: true, MaxAge: 3 * time.Second})
	for _, bad := range []string{"500ms", "0", "soon", "-1"} {
		if ans := tw.pubTTL("exp.bad", bad); !bytes.Contains(ans, []byte(`"err_code":10165`)) {
			t.Fatalf("ttl %s: %s", bad, ans)
		}
	}
	tw.pubTTL("exp.a", "1s")
	tw.pubTTL("exp.b", "never")
	tw.pub("exp.c", []byte("c"))
	tw.pubTTL("exp.d", "1")
	tw.pubTTL("exp.e", "1h")
	tw.settle("EXP", func(st jetstream.StreamState) bool { return st.Msgs == 3 })
	if got := tw.storedAll("EXP"); len(got) != 3 {
		t.Fatalf("after the TTLs: %q", got)
	}
	// max_age takes what has no TTL and what has a longer one, never "never".
	tw.settle("EXP", func(st jetstream.StreamState) bool { return st.Msgs == 1 })
	if got := tw.storedAll("EXP"); len(got) != 1 || !strings.HasPrefix(got[0], "2 exp.b Nats-TTL=never;") {
		t.Fatalf("after max_age: %q", got)
	}
}

// With subject delete markers, a subject that expiry leaves without a message gets a
// marker, whose own TTL then takes it; a subject that keeps a message gets none; a TTL
// under the markers' is raised to theirs, header and all.
func TestDeleteMarkersTwin(t *testing.T) {
	t.Parallel()
	tw := newTwin(t)
	tw.createBoth(jetstream.StreamConfig{Name: "SDM", Subjects: []string{"sdm.>"}, SubjectDeleteMarkerTTL: 3 * time.Second})
	tw.pubTTL("sdm.a", "1s")
	tw.pub("sdm.b", []byte("b1"))
	tw.pubTTL("sdm.b", "3s")
	tw.pub("sdm.c", []byte("c"))
	tw.pubTTL("sdm.d", "4s")
	tw.pubTTL("sdm.d", "4s")
	raised := tw.storedAll("SDM")
	if len(raised) != 6 || !strings.Contains(raised[0], "Nats-TTL=3;") {
		t.Fatalf("stored: %q", raised)
	}
	// At 3s sdm.a goes for a marker and sdm.b's second message just goes; at 4s both of
	// sdm.d's go for one marker.
	tw.settle("SDM", func(st jetstream.StreamState) bool { return st.LastSeq == 8 && st.Msgs == 4 })
	got := tw.storedAll("SDM")
	want := []string{
		`2 sdm.b  "b1"`,
		`4 sdm.c  "c"`,
		`7 sdm.a Nats-Marker-Reason=MaxAge;Nats-Rollup=sub;Nats-TTL=3s; ""`,
		`8 sdm.d Nats-Marker-Reason=MaxAge;Nats-Rollup=sub;Nats-TTL=3s; ""`,
	}
	if !slices.Equal(got, want) {
		t.Fatalf("after expiry:\n%q\nwant\n%q", got, want)
	}
	// The markers' own TTLs take them, leaving no marker behind.
	tw.settle("SDM", func(st jetstream.StreamState) bool { return st.Msgs == 2 })
	if got := tw.storedAll("SDM"); !slices.Equal(got, want[:2]) {
		t.Fatalf("after the markers' TTL: %q", got)
	}
	// A purge or a delete request leaves no marker.
	tw.purge("SDM", jetstream.WithPurgeSubject("sdm.c"))
	tw.deleteMsg("SDM", 2)
	if got := tw.storedAll("SDM"); len(got) != 0 {
		t.Fatalf("after a purge and a delete: %q", got)
	}
	tw.want("SDM", 0, 9, 8, 0)
}

// errStreamInvalidConfig is nats-server's err_code for an invalid stream configuration,
// which nats.go does not name.
const errStreamInvalidConfig jetstream.ErrorCode = 10052
