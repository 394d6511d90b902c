package jswire

import (
	"strings"
	"testing"
)

func TestFlowControlSubject(t *testing.T) {
	seen := map[string]bool{}
	for r := range uint64(1000) {
		subj := FlowControlSubject("S", "C", r*7919)
		if !strings.HasPrefix(subj, "$JS.FC.S.C.") || len(subj) != len("$JS.FC.S.C.")+4 {
			t.Fatalf("subject %q", subj)
		}
		seen[subj] = true
		s, c, ok := ParseFlowControlSubject(subj)
		if !ok || s != "S" || c != "C" {
			t.Fatalf("parse %q: %q %q %v", subj, s, c, ok)
		}
	}
	if len(seen) != 1000 {
		t.Fatalf("%d distinct ids of 1000", len(seen))
	}
	for _, bad := range []string{"$JS.FC.S.C", "$JS.FC.S..x", "$JS.FC..C.x", "$JS.FC.S.C.x.y", "$JS.ACK.S.C.x", "$JS.FC.S.C."} {
		if _, _, ok := ParseFlowControlSubject(bad); ok {
			t.Errorf("parsed %q", bad)
		}
	}
}

func TestPushStatusLines(t *testing.T) {
	if got := string(FlowControlStatus()); got != "NATS/1.0 100 FlowControl Request\r\n\r\n" {
		t.Errorf("flow control %q", got)
	}
	want := "NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 7\r\nNats-Last-Stream: 9\r\n\r\n"
	if got := string(PushHeartbeatStatus(7, 9, "")); got != want {
		t.Errorf("heartbeat %q", got)
	}
	want = "NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 7\r\nNats-Last-Stream: 9\r\nNats-Consumer-Stalled: $JS.FC.S.C.abcd\r\n\r\n"
	if got := string(PushHeartbeatStatus(7, 9, "$JS.FC.S.C.abcd")); got != want {
		t.Errorf("stalled heartbeat %q", got)
	}
}

// An answer acks what its headers name, as a sourcing stream writes them, and nothing
// without a positive stream sequence.
func TestFlowControlAck(t *testing.T) {
	for _, c := range []struct {
		hdr        string
		sseq, dseq uint64
		ok         bool
	}{
		{"NATS/1.0\r\nNats-Last-Consumer: 7\r\nNats-Last-Stream: 9\r\n\r\n", 9, 7, true},
		{"NATS/1.0\r\nNats-Last-Consumer: 0\r\nNats-Last-Stream: 9\r\n\r\n", 9, 0, true},
		{"NATS/1.0\r\nNats-Last-Stream: 9\r\n\r\n", 9, 0, true},
		{"NATS/1.0\r\nNats-Last-Consumer: -3\r\nNats-Last-Stream: 9\r\n\r\n", 9, 0, true},
		{"NATS/1.0\r\nNats-Last-Consumer: 7\r\nNats-Last-Stream: 0\r\n\r\n", 0, 0, false},
		{"NATS/1.0\r\nNats-Last-Consumer: 7\r\nNats-Last-Stream: x\r\n\r\n", 0, 0, false},
		{"NATS/1.0\r\nNats-Last-Consumer: 7\r\n\r\n", 0, 0, false},
		{"", 0, 0, false},
	} {
		sseq, dseq, ok := FlowControlAck([]byte(c.hdr))
		if sseq != c.sseq || dseq != c.dseq || ok != c.ok {
			t.Errorf("%q: %d %d %v, want %d %d %v", c.hdr, sseq, dseq, ok, c.sseq, c.dseq, c.ok)
		}
	}
}
