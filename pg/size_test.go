package pg_test

import (
	"maps"
	"testing"

	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

// MessageSize in Go and jetgres.message_size in SQL must agree, or the limits the append
// path checks in Go drift from the bytes retention counts in SQL: for file streams, and for
// memory streams, which count as nats-server's memory store does.
func TestMessageSizeAgreesWithSQL(t *testing.T) {
	t.Parallel()
	for _, memory := range []bool{false, true} {
		config := `{"storage":"file"}`
		if memory {
			config = `{"storage":"memory"}`
		}
		t.Run(config, func(t *testing.T) {
			t.Parallel()
			messageSizeAgrees(t, config, memory)
		})
	}
}

func messageSizeAgrees(t *testing.T, config string, memory bool) {
	ctx := t.Context()
	db := pgtest.Open(t)
	st, err := db.CreateStream(ctx, "S", []byte(config))
	if err != nil {
		t.Fatal(err)
	}
	msgs := []pg.AppendMsg{
		{Subject: "a", Data: []byte("x")},
		{Subject: "a.b", Data: nil},
		{Subject: "a.b", Header: []byte{}, Data: []byte{}},
		{Subject: "hdr", Header: []byte("NATS/1.0\r\nK: v\r\n\r\n"), Data: []byte("payload")},
		{Subject: "hdr.only", Header: []byte("NATS/1.0\r\n\r\n")},
		{Subject: "größe.ü", Data: make([]byte, 1000)},
	}
	res, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, Msgs: msgs}}, 1)
	if err != nil {
		t.Fatal(err)
	}
	want := make(map[uint64]uint64)
	for i, m := range msgs {
		want[res[0].Outcomes[i].Seq] = pg.MessageSize(memory, m.Subject, m.Header, m.Data)
	}
	subjects := []string{"a", "a.b", "hdr", "hdr.only", "größe.ü"}
	got, err := db.SQLSizes(ctx, st.ID, subjects)
	if err != nil {
		t.Fatal(err)
	}
	for path, sizes := range got {
		if !maps.Equal(sizes, want) {
			t.Errorf("%s: sizes by sequence %v, MessageSize gives %v", path, sizes, want)
		}
	}
	info, err := db.State(ctx, st.ID)
	if err != nil {
		t.Fatal(err)
	}
	var sum uint64
	for _, n := range want {
		sum += n
	}
	if info.Bytes != sum {
		t.Errorf("stream state counts %d bytes, MessageSize sums to %d", info.Bytes, sum)
	}
}
