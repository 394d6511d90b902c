package pg_test

import (
	"context"
	"testing"
	"time"

	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// TestSynchronousCommitPerTransaction reads synchronous_commit from inside the transactions
// themselves, through triggers on the rows the push and cursor paths update: both paths run
// at the configured mode, and an admin statement on the same connection, after them, at the
// connection's own setting ("local" here, so that it differs from both modes).
func TestSynchronousCommitPerTransaction(t *testing.T) {
	for _, mode := range []string{"on", "off"} {
		t.Run(mode, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			url := pgtest.WithParam(t, pgtest.NewDB(t), "options", "--synchronous_commit=local")
			db, err := pg.Open(ctx, pg.Config{URL: url, MaxConns: 1, SynchronousCommit: mode})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			if err := db.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			raw := rawsql.Open(t, url)
			for _, sql := range []string{
				`CREATE TABLE public.modes (n serial, tbl text, mode text)`,
				`CREATE FUNCTION public.record_mode() RETURNS trigger LANGUAGE plpgsql AS $$
				BEGIN
					INSERT INTO public.modes (tbl, mode) VALUES (TG_TABLE_NAME, current_setting('synchronous_commit'));
					RETURN NULL;
				END $$`,
				`CREATE TRIGGER record_mode AFTER UPDATE ON jetgres.stream_state FOR EACH ROW EXECUTE FUNCTION public.record_mode()`,
				`CREATE TRIGGER record_mode AFTER UPDATE ON jetgres.consumers FOR EACH ROW EXECUTE FUNCTION public.record_mode()`,
			} {
				if err := raw.Exec(ctx, sql); err != nil {
					t.Fatal(err)
				}
			}

			st, err := db.CreateStream(ctx, "S", []byte(`{}`))
			if err != nil {
				t.Fatal(err)
			}
			// The first append takes the general path (nothing known of the stream yet), the
			// later ones the one-round-trip path.
			for i := range 3 {
				if _, _, err := db.Append(ctx, []pg.AppendBatch{{StreamID: st.ID, Msgs: []pg.AppendMsg{{Subject: "s", Data: []byte{byte(i)}}}}}, time.Now().UnixNano()); err != nil {
					t.Fatal(err)
				}
			}
			c, err := db.CreateConsumer(ctx, pg.Consumer{StreamID: st.ID, Name: "C", Config: []byte(`{}`), Owner: "r1"}, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := db.WriteCursor(ctx, pg.CursorParams{StreamID: st.ID, Name: "C", Created: c.Created, Owner: "r1", AckStreamSeq: 2, AckConsumerSeq: 2}); err != nil {
				t.Fatal(err)
			}
			// A lazy write, which no double ack waits for, commits asynchronously whatever the mode.
			if _, err := db.WriteCursor(ctx, pg.CursorParams{StreamID: st.ID, Name: "C", Created: c.Created, Owner: "r1", AckStreamSeq: 3, AckConsumerSeq: 3, Lazy: true}); err != nil {
				t.Fatal(err)
			}
			if err := db.UpdateConsumerConfig(ctx, st.ID, "C", []byte(`{"a":1}`)); err != nil {
				t.Fatal(err)
			}

			want := []string{"stream_state " + mode, "stream_state " + mode, "stream_state " + mode, "consumers " + mode, "consumers off", "consumers local"}
			got := raw.Strings(t, `SELECT tbl || ' ' || mode FROM public.modes ORDER BY n`)
			if len(got) != len(want) {
				t.Fatalf("synchronous_commit per transaction = %q, want %q", got, want)
			}
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("synchronous_commit per transaction = %q, want %q", got, want)
				}
			}
		})
	}
}
