package pg

import (
	"context"
	"time"
)

// RetireIdleChunk exposes the maintainer's chunk rotation to tests of the append paths.
func (db *DB) RetireIdleChunk(ctx context.Context, id int64, idle time.Duration) error {
	return db.retireIdleChunk(ctx, id, idle)
}
