package pg_test

import (
	"fmt"
	"testing"

	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

// LastSeqsBefore finds each subject's last message below a sequence and from a floor, one
// that a per-subject limit replaced included (nats-server reads it before the replacing
// message is stored), and nothing for a subject with none.
func TestLastSeqsBefore(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.Open(t)
	st, err := db.CreateStream(ctx, "L", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	// Sequences 1 to 6 on a, b, a, c, a, b, one commit each, with one message per subject.
	for _, subj := range []string{"a", "b", "a", "c", "a", "b"} {
		if _, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, Limits: pg.Limits{MaxMsgsPer: 1},
			Msgs: []pg.AppendMsg{{Subject: subj, Data: []byte(subj)}}}}, 1); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		from, before uint64
		want         string
	}{
		{0, 7, "map[a:5 b:6 c:4]"},
		{0, 6, "map[a:5 b:2 c:4]"},
		{0, 5, "map[a:3 b:2 c:4]"},
		{0, 2, "map[a:1]"},
		{3, 6, "map[a:5 c:4]"},
		{0, 1, "map[]"},
	} {
		got, err := db.LastSeqsBefore(ctx, st.ID, []string{"a", "b", "c", "none"}, c.from, c.before)
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(got) != c.want {
			t.Errorf("from %d before %d: %v, want %s", c.from, c.before, got, c.want)
		}
	}
}
