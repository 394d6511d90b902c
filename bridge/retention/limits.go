package retention

import (
	"context"
	"time"

	"github.com/jetgres/jetgres/pg"
)

// ApplyLimits applies a stream's limits, and its max_age when positive, to what s already
// holds, as JetStream does when an update lowers them.
func (e *Enforcer[S]) ApplyLimits(ctx context.Context, s S, lim pg.Limits, maxAge time.Duration) error {
	n, err := e.store.EnforceLimits(ctx, s.ID(), lim)
	if err != nil {
		return err
	}
	if cfg := s.ConfigView(); cfg.AllowMsgTTL {
		// As the maintainer expires such a stream: max_age passes over what never expires,
		// and a subject it empties gets its marker.
		if err := e.expireTTL(ctx, s, cfg, e.clock.Now()); err != nil {
			return err
		}
	} else if maxAge > 0 {
		expired, err := e.store.ExpireOlder(ctx, s.ID(), e.clock.Now().Add(-maxAge).UnixNano())
		if err != nil {
			return err
		}
		n += expired
	}
	if n > 0 {
		e.host.Purged(ctx, s, 0, false)
	}
	return nil
}
