package pg

import (
	"context"

	"github.com/jackc/pgx/v5"
)

const sqlSettingSources = `SELECT name, source FROM pg_settings WHERE name LIKE 'tcp\_%' OR name = 'jit'`

func settingSources(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}) (map[string]string, error) {
	rows, err := q.Query(ctx, sqlSettingSources)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string)
	for rows.Next() {
		var name, source string
		if err := rows.Scan(&name, &source); err != nil {
			return nil, err
		}
		out[name] = source
	}
	return out, rows.Err()
}

// SettingSources is where a pooled session's tcp_* and jit settings come from, by name.
func (db *DB) SettingSources(ctx context.Context) (map[string]string, error) {
	return settingSources(ctx, db.pool)
}

// SettingSources is where the ownership session's tcp_* settings come from, by name.
func (o *Ownership) SettingSources(ctx context.Context) (map[string]string, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return settingSources(ctx, o.conn)
}
