package pg_test

import (
	"context"
	"testing"
	"time"

	"github.com/jetgres/jetgres/pg"
	"github.com/jetgres/jetgres/pg/pgtest"
)

// With Config.Keepalive, every pooled session and the ownership session start with the
// settings that let PostgreSQL end them once their network falls silent, and PostgreSQL
// accepts them. Their values read as zero on the Unix socket the tests use; the partition
// test in e2e shows their effect over TCP.
func TestKeepaliveSettingsSent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.OpenWith(t, pg.Config{URL: pgtest.NewDB(t), Keepalive: 4 * time.Second})
	o := openOwnership(t, db)
	pool, err := db.SettingSources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	own, err := o.SettingSources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for what, sources := range map[string]map[string]string{"pool": pool, "ownership": own} {
		for _, name := range []string{"tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count", "tcp_user_timeout"} {
			if got := sources[name]; got != "client" {
				t.Errorf("%s session: %s comes from %q, want the client's startup", what, name, got)
			}
		}
	}
}
