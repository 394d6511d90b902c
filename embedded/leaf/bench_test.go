package leaf

import (
	"strings"
	"testing"
)

// offlineConn is a Conn without a socket: enough to exercise dispatch.
func offlineConn() *Conn {
	return &Conn{localKeys: make(map[string]int), wake: make(chan struct{}, 1), done: make(chan struct{})}
}

func BenchmarkDeliver(b *testing.B) {
	c := offlineConn()
	var kept *Msg
	if _, err := c.Subscribe("_INBOX.abc.*", "", func(m *Msg) { kept = m }); err != nil {
		b.Fatal(err)
	}
	op := &Op{
		Kind:    OpMsg,
		Subject: []byte("_INBOX.abc.7"),
		Reply:   []byte("$JS.ACK.s.c.1.1.1.1.0"),
		Data:    []byte(strings.Repeat("x", 128)),
	}
	b.ReportAllocs()
	for b.Loop() {
		c.deliver(op)
	}
	if kept == nil || kept.Subject != "_INBOX.abc.7" {
		b.Fatal("not delivered")
	}
}

func BenchmarkAppendMsg(b *testing.B) {
	hdr := []byte("NATS/1.0\r\nNats-Msg-Id: 1\r\n\r\n")
	data := []byte(strings.Repeat("x", 128))
	buf := make([]byte, 0, 4096)
	b.ReportAllocs()
	for b.Loop() {
		buf = appendMsg(buf[:0], "_INBOX.abc.7", "$JS.ACK.s.c.1.1.1.1.0@orders.new", "", hdr, data)
	}
}
