package pg_test

import (
	"errors"
	"maps"
	"slices"
	"testing"

	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

// The same filters select the same subjects in Go (SubjectMatches) and in PostgreSQL (the
// equality or regular expression a read sends), including subjects holding characters a
// regular expression would take for operators.
func TestSubjectMatchingAgreesWithSQL(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.Open(t)
	st, err := db.CreateStream(ctx, "S", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	subjects := []string{"a", "b", "a.b", "a.bb", "ab.b", "a.b.c", "a.x.c", "a.b.c.d", "aab.c", "a+b.c", "a$.b", "x.(y)", "x.y", "x.[y]", `x.\y`}
	var msgs []pg.AppendMsg
	for _, s := range subjects {
		msgs = append(msgs, pg.AppendMsg{Subject: s, Data: []byte(s)})
	}
	if _, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, Msgs: msgs}}, 1); err != nil {
		t.Fatal(err)
	}
	filters := []string{">", "*", "a", "a.b", "a.*", "a.>", "*.b", "*.*", "*.*.>", "a.*.c", "a.b.>", "a.b.c.>", "a+b.*", "a$.b", "x.(y)", "x.[y]", `x.\y`, "x.*", "?.b", "a.b.c.d.e", "a$.>", "x.>", "x.(y).>"}
	for _, f := range filters {
		var want []string
		var last uint64
		for i, s := range subjects {
			if pg.SubjectMatches(f, s) {
				want = append(want, s)
				last = uint64(i + 1)
			}
		}
		totals, err := db.SubjectTotals(ctx, st.ID, f)
		if err != nil {
			t.Fatal(err)
		}
		if got := slices.Sorted(maps.Keys(totals)); !slices.Equal(got, slices.Sorted(slices.Values(want))) {
			t.Errorf("filter %q: PostgreSQL selects %q, SubjectMatches %q", f, got, want)
		}
		m, err := db.LastBySubject(ctx, st.ID, f)
		switch {
		case errors.Is(err, pg.ErrNotFound):
			if last != 0 {
				t.Errorf("filter %q: LastBySubject found nothing, SubjectMatches ends at sequence %d", f, last)
			}
		case err != nil:
			t.Fatal(err)
		case m.Seq != last:
			t.Errorf("filter %q: LastBySubject is sequence %d, SubjectMatches ends at %d", f, m.Seq, last)
		}
	}
}
