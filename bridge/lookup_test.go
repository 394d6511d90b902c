package bridge

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/pg/pgtest/rawsql"
)

// A request for a stream nobody created is answered "not found" from one read of that name:
// it takes no admin lock, so it neither waits behind a stream being created, updated or
// deleted nor keeps the API workers from them.
func TestUnknownStreamTakesNoAdminLock(t *testing.T) {
	t.Parallel()
	tb := setup(t, setupOpts{})
	tb.bridge.streams.LockAdmin()
	unlocked := false
	unlock := func() {
		if !unlocked {
			unlocked = true
			tb.bridge.streams.UnlockAdmin()
		}
	}
	t.Cleanup(unlock)
	m, err := tb.nc.Request("$JS.API.STREAM.INFO.NOPE", nil, 5*time.Second)
	unlock()
	if err != nil {
		t.Fatalf("STREAM.INFO of an unknown stream while the admin lock is held: %v", err)
	}
	var r jsonAPIReply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		t.Fatal(err)
	}
	if want := server.ApiErrors[server.JSStreamNotFoundErr].ErrCode; r.Error == nil || r.Error.ErrCode != want {
		t.Fatalf("reply %s, want err_code %d", m.Data, want)
	}
}

// A stream that PostgreSQL holds but this replica has not heard of yet (another replica
// created it a moment ago) is updated and deleted, not answered "not found" from memory.
func TestUpdateAndDeleteFindStoredStreams(t *testing.T) {
	t.Parallel()
	tb := setup(t, setupOpts{})
	ctx := context.Background()
	if _, err := tb.js.CreateStream(ctx, jetstream.StreamConfig{Name: "SEEN", Subjects: []string{"seen.>"}}); err != nil {
		t.Fatal(err)
	}
	raw := rawsql.Open(t, tb.dbURL)
	// Stored as another replica stores a stream, without the notification that would tell
	// this one at once.
	for _, name := range []string{"UNSEEN_A", "UNSEEN_B"} {
		if err := raw.Exec(ctx, `WITH s AS (INSERT INTO jetgres.streams (name, config)
				SELECT $1, jsonb_set(jsonb_set(config, '{name}', to_jsonb($1::text)), '{subjects}', jsonb_build_array(lower($1) || '.>'))
				FROM jetgres.streams WHERE name = 'SEEN' RETURNING id)
			INSERT INTO jetgres.stream_state (stream_id) SELECT id FROM s`, name); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tb.js.UpdateStream(ctx, jetstream.StreamConfig{Name: "UNSEEN_A", Subjects: []string{"unseen_a.>"}, Description: "updated"}); err != nil {
		t.Fatalf("update of a stream another replica stored: %v", err)
	}
	if err := tb.js.DeleteStream(ctx, "UNSEEN_B"); err != nil {
		t.Fatalf("delete of a stream another replica stored: %v", err)
	}
	if n := raw.Strings(t, `SELECT name FROM jetgres.streams WHERE name = 'UNSEEN_B'`); len(n) != 0 {
		t.Fatalf("the deleted stream is still stored")
	}
}
