package pg_test

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"

	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

// adder is a DeriveFunc that stores the last message's number plus n: a counter as pg sees
// it, without the wire format.
func adder(n int) pg.DeriveFunc {
	return func(last *pg.Message) ([]byte, []byte, error) {
		total := n
		if last != nil {
			v, err := strconv.Atoi(string(last.Data))
			if err != nil {
				return nil, nil, errors.New("broken")
			}
			total += v
		}
		return []byte("NATS/1.0\r\nIncr: " + strconv.Itoa(n) + "\r\n\r\n"), []byte(strconv.Itoa(total)), nil
	}
}

// Derived messages add to the last live message of their subject: the batch's own earlier
// ones, what committed before, nothing once a delete or a purge took it (the delete of the
// last one leaves the one before it), and nothing once a discard-old limit evicted it in the
// same batch. Eight appenders adding to one subject at once sum exactly, since each reads
// the last value under the stream's row lock. A refusal from Derive refuses that message.
func TestAppendDeriveAddsToTheSubjectsLast(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := pgtest.Open(t)
	st, err := db.CreateStream(ctx, "CTR", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	id := st.ID
	add := func(limits pg.Limits, msgs ...pg.AppendMsg) pg.AppendResult {
		t.Helper()
		res, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: id, Limits: limits, Msgs: msgs}}, 1)
		if err != nil {
			t.Fatal(err)
		}
		return res[0]
	}
	incr := func(subject string, n int) pg.AppendMsg { return pg.AppendMsg{Subject: subject, Derive: adder(n)} }
	vals := func(r pg.AppendResult) string {
		var out []string
		for _, o := range r.Outcomes {
			if o.Err != nil {
				out = append(out, o.Err.Error())
				continue
			}
			out = append(out, o.Data)
		}
		return fmt.Sprint(out)
	}
	check := func(what string, r pg.AppendResult, want string) {
		t.Helper()
		if got := vals(r); got != want {
			t.Fatalf("%s: %s, want %s", what, got, want)
		}
	}

	check("a first batch", add(pg.Limits{}, incr("a", 1), incr("b", 10), incr("a", 2)), "[1 10 3]")
	check("the next batch", add(pg.Limits{}, incr("a", -5), pg.AppendMsg{Subject: "c", Data: []byte("x")}), "[-2 ]")
	last, err := db.LastBySubject(ctx, id, "a")
	if err != nil || string(last.Data) != "-2" || string(last.Header) != "NATS/1.0\r\nIncr: -5\r\n\r\n" {
		t.Fatalf("stored: %+v, %v", last, err)
	}
	if err := db.DeleteMessage(ctx, id, last.Seq); err != nil {
		t.Fatal(err)
	}
	check("after deleting the last", add(pg.Limits{}, incr("a", 1)), "[4]")
	if _, err := db.Purge(ctx, id, pg.PurgeParams{Filter: "a"}); err != nil {
		t.Fatal(err)
	}
	check("after a purge", add(pg.Limits{}, incr("a", 7), incr("b", 1)), "[7 11]")
	if _, err := db.Purge(ctx, id, pg.PurgeParams{}); err != nil {
		t.Fatal(err)
	}
	// max_msgs 1: b's message evicts a's before a's next increment reads it.
	check("evicted in the batch", add(pg.Limits{MaxMsgs: 1}, incr("a", 1), incr("b", 1), incr("a", 5)), "[1 1 5]")
	broken := pg.AppendMsg{Subject: "a", Derive: func(*pg.Message) ([]byte, []byte, error) { return nil, nil, errors.New("refused") }}
	check("a refusal", add(pg.Limits{}, broken, incr("a", 1)), "[refused 6]")

	const publishers, each = 8, 25
	var wg sync.WaitGroup
	errs := make(chan error, publishers)
	for range publishers {
		wg.Go(func() {
			for range each {
				if _, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: id, Msgs: []pg.AppendMsg{incr("hot", 1), incr("hot", 1)}}}, 1); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	last, err = db.LastBySubject(ctx, id, "hot")
	if err != nil || string(last.Data) != strconv.Itoa(publishers*each*2) {
		t.Fatalf("after %d concurrent increments: %+v, %v", publishers*each*2, last, err)
	}
}

// Two replicas incrementing the same counters in turn each add to what the other stored:
// the last values one remembers from its own commits stop counting once the other appends,
// deletes or purges, though the first replica's next increment would otherwise take the
// fast path with them.
func TestAppendDeriveAcrossReplicas(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := pgtest.NewDB(t)
	a, b := pgtest.OpenAt(t, url), pgtest.OpenAt(t, url)
	st, err := a.CreateStream(ctx, "CTR", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	add := func(db *pg.DB, n int) {
		t.Helper()
		total += n
		res, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, Msgs: []pg.AppendMsg{{Subject: "x", Derive: adder(n)}}}}, 1)
		if err != nil {
			t.Fatal(err)
		}
		if o := res[0].Outcomes[0]; o.Err != nil || o.Data != strconv.Itoa(total) {
			t.Fatalf("after adding %d: %+v, want %d", n, o, total)
		}
	}
	add(a, 1)
	add(a, 2)
	add(b, 3)
	add(a, 4)
	add(a, 5)
	add(b, 6)
	add(b, 7)
	add(a, 8)
	last, err := b.LastBySubject(ctx, st.ID, "x")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.DeleteMessage(ctx, st.ID, last.Seq); err != nil {
		t.Fatal(err)
	}
	total -= 8
	add(a, 10)
	if _, err := b.Purge(ctx, st.ID, pg.PurgeParams{}); err != nil {
		t.Fatal(err)
	}
	total = 0
	add(a, 11)
	add(a, 12)
}
