package bridge

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg/pgtest"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// TestCursorWriteLazyUntilDoubleAck reads synchronous_commit from inside each cursor write,
// through a trigger on the consumers' rows: a write that only plain acks asked for commits
// without waiting for the WAL flush, and the write a double ack waits for at the
// connection's own setting ("local" here, so that it differs from "off").
func TestCursorWriteLazyUntilDoubleAck(t *testing.T) {
	t.Parallel()
	url := pgtest.WithParam(t, pgtest.NewDB(t), "options", "--synchronous_commit=local")
	tb := setup(t, setupOpts{db: pgtest.OpenAt(t, url), config: func(c *Config) { c.CursorInterval = time.Hour }})
	ctx := testContext(t)
	raw := rawsql.Open(t, url)
	for _, sql := range []string{
		`CREATE TABLE public.modes (n serial, ack bigint, mode text)`,
		`CREATE FUNCTION public.record_mode() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO public.modes (ack, mode) VALUES (NEW.ack_stream_seq, current_setting('synchronous_commit'));
			RETURN NULL;
		END $$`,
		// Only the cursor writes set the ack floor: lease renewals update the same row.
		`CREATE TRIGGER record_mode AFTER UPDATE OF ack_stream_seq ON jetgres.consumers FOR EACH ROW EXECUTE FUNCTION public.record_mode()`,
	} {
		if err := raw.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	modes := func() ([]string, error) {
		rows, err := raw.Query(ctx, `SELECT ack || ' ' || mode FROM public.modes WHERE ack > 0 ORDER BY n`)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		var got []string
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				return nil, err
			}
			got = append(got, s)
		}
		return got, rows.Err()
	}
	s := newStream(t, ctx, tb, "LAZY", "lazy.>")
	publishN(t, ctx, tb.js, "lazy.x", 2)
	c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	msgs := fetchExactly(t, c, 2)
	// The first floor is written at once (nothing was written before), lazily.
	if err := msgs[0].Ack(); err != nil {
		t.Fatal(err)
	}
	want := []string{"1 off"}
	testwait.For(t, 5*time.Second, func() error {
		got, err := modes()
		if err == nil && !slices.Equal(got, want) {
			err = fmt.Errorf("cursor writes %q, want %q", got, want)
		}
		return err
	})
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := msgs[1].DoubleAck(dctx); err != nil {
		t.Fatalf("double ack: %v", err)
	}
	want = append(want, "2 local")
	if got, err := modes(); err != nil || !slices.Equal(got, want) {
		t.Fatalf("cursor writes %q (%v), want %q", got, err, want)
	}
}
