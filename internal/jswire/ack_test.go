package jswire

import "testing"

func TestAckSubjectRoundTrip(t *testing.T) {
	a := AckInfo{Stream: "ORDERS", Consumer: "C1", Delivered: 2, StreamSeq: 41, ConsumerSeq: 7, TS: 1_700_000_000_123_456_789, Pending: 12}
	s := string(AppendAckSubject(nil, a))
	if want := "$JS.ACK.ORDERS.C1.2.41.7.1700000000123456789.12"; s != want {
		t.Fatalf("subject %q, want %q", s, want)
	}
	got, ok := ParseAckSubject(s)
	if !ok || got != a {
		t.Fatalf("parsed %+v, %v; want %+v", got, ok, a)
	}
	v2, ok := ParseAckSubject("$JS.ACK.hub.ACCHASH.ORDERS.C1.2.41.7.1700000000123456789.12.xyz")
	if !ok || v2 != a {
		t.Fatalf("v2 parsed %+v, %v; want %+v", v2, ok, a)
	}
	for _, bad := range []string{
		"", "$JS.ACK", "$JS.ACK.S.C.1.2.3.4", "$JS.ACK.S.C.1.2.3.4.5.6", "$JS.ACK.S.C.1.-2.3.4.5",
		"$JS.ACK..C.1.2.3.4.5", "$JS.API.S.C.1.2.3.4.5", "$JS.ACK.S.C.1.2.3.99999999999999999999.5",
		"$JS.ACK.S.C.1.2.3.4.+5",
	} {
		if _, ok := ParseAckSubject(bad); ok {
			t.Errorf("parsed %q", bad)
		}
	}
}

func FuzzAckSubject(f *testing.F) {
	f.Add("$JS.ACK.ORDERS.C1.1.2.3.4.5")
	f.Add("$JS.ACK.d.h.S.C.1.2.3.4.5.x")
	f.Add("$JS.ACK.S.C.18446744073709551615.0.0.9223372036854775807.0")
	f.Fuzz(func(t *testing.T, s string) {
		a, ok := ParseAckSubject(s)
		if !ok {
			return
		}
		if a.Stream == "" || a.Consumer == "" || a.TS < 0 {
			t.Fatalf("accepted %q as %+v", s, a)
		}
		again, ok := ParseAckSubject(string(AppendAckSubject(nil, a)))
		if !ok || again != a {
			t.Fatalf("%q: round trip gave %+v, %v from %+v", s, again, ok, a)
		}
	})
}

// A reply subject is built for every delivery and parsed for every ack: neither may
// allocate, nor may reading what the ack asks for.
func TestAckPathAllocs(t *testing.T) {
	a := AckInfo{Stream: "ORDERS", Consumer: "C1", Delivered: 2, StreamSeq: 41, ConsumerSeq: 7, TS: 1_700_000_000_123_456_789, Pending: 12}
	buf := make([]byte, 0, 128)
	subj := string(AppendAckSubject(nil, a))
	body := []byte("+ACK")
	for name, f := range map[string]func(){
		"AppendAckSubject": func() { buf = AppendAckSubject(buf[:0], a) },
		"ParseAckSubject":  func() { _, _ = ParseAckSubject(subj) },
		"ClassifyAck":      func() { _ = ClassifyAck(body) },
	} {
		if n := testing.AllocsPerRun(100, f); n != 0 {
			t.Errorf("%s allocates %v times", name, n)
		}
	}
}

func BenchmarkParseAckSubject(b *testing.B) {
	subj := "$JS.ACK.ORDERS.C1.2.41.7.1700000000123456789.12"
	b.ReportAllocs()
	for b.Loop() {
		_, _ = ParseAckSubject(subj)
	}
}
