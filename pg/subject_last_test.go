package pg_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

// TestLastSeqsPerSubjectIndexed checks that the last sequences per subject a stream's subject
// index gives are those its rows give, for each kind of filter, and that a state the index
// does not describe is read from the rows.
func TestLastSeqsPerSubjectIndexed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.Open(t)
	st, err := db.CreateStream(ctx, "KV", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, subj := range []string{"kv.a", "kv.b", "kv.a", "kv.c", "kv.b", "other.b", "kv.d"} {
		_, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, Limits: pg.Limits{MaxMsgsPer: 1},
			Msgs: []pg.AppendMsg{{Subject: subj, Data: []byte(subj)}}}}, time.Now().UnixNano())
		if err != nil {
			t.Fatal(err)
		}
	}
	if !db.HasSubjectIndex(st.ID) {
		t.Fatal("no subject index after appends with a per-subject limit")
	}
	cases := []struct {
		filters []string
		want    []uint64
	}{
		{nil, []uint64{3, 4, 5, 6, 7}},
		{[]string{"kv.>"}, []uint64{3, 4, 5, 7}},
		{[]string{"kv.a", "kv.c"}, []uint64{3, 4}},
		{[]string{"*.b"}, []uint64{5, 6}},
	}
	check := func(how string, upTo uint64, want func([]uint64) []uint64) {
		t.Helper()
		for _, c := range cases {
			got, err := db.LastSeqsPerSubject(ctx, st.ID, c.filters, upTo)
			if err != nil || !slices.Equal(got, want(c.want)) {
				t.Errorf("%s, filters %q through %d: %v %v, want %v", how, c.filters, upTo, got, err, want(c.want))
			}
		}
	}
	same := func(w []uint64) []uint64 { return w }
	check("indexed", 7, same)
	// A list asked for at an earlier state is not the index's: the rows answer it.
	check("behind the index", 6, func(w []uint64) []uint64 {
		return slices.DeleteFunc(slices.Clone(w), func(s uint64) bool { return s > 6 })
	})
	db.ForgetSubjectIndex(st.ID)
	check("from the rows", 7, same)
}
