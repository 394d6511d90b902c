package replay

import (
	"testing"
	"time"

	"github.com/jetgres/jetgres/pg"
)

func TestOriginalPacesAsStored(t *testing.T) {
	base := time.Unix(1_700_000_000, 0)
	at := func(d time.Duration) int64 { return base.Add(d).UnixNano() }
	r := Original(3)
	now := base
	if r.Hold(pg.Message{Seq: 1, TS: at(0)}, now) {
		t.Fatal("the first message was held")
	}
	if r.Hold(pg.Message{Seq: 2, TS: at(time.Second)}, now) != true {
		t.Fatal("a message stored a second later went at once")
	}
	if !r.At().Equal(now.Add(time.Second)) {
		t.Fatalf("At = %v, want a second on", r.At())
	}
	now = now.Add(time.Second)
	if r.Hold(pg.Message{Seq: 2, TS: at(time.Second)}, now) {
		t.Fatal("a message was held past its time")
	}
	if r.Hold(pg.Message{Seq: 3, TS: at(time.Second + time.Microsecond)}, now) {
		t.Fatal("a gap under a millisecond was waited for")
	}
	r.Delivering(4)
	if r.Hold(pg.Message{Seq: 4, TS: at(time.Hour)}, now) {
		t.Fatal("a consumer that caught up is still paced")
	}
	var off Pacer
	off.Hold(pg.Message{Seq: 1, TS: at(0)}, now)
	if off.Hold(pg.Message{Seq: 2, TS: at(time.Hour)}, now) {
		t.Fatal("the zero Pacer held a message")
	}
}
