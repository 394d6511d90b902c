package jswire

import (
	"errors"

	"github.com/nats-io/nats-server/v2/server"
)

// checkCounterConfig refuses what a counter stream (allow_msg_counter) cannot be, as
// nats-server does: a publish there adds to its subject's last message, which a discard
// new policy, message TTLs, schedules, or a retention that removes what was consumed would
// take away or keep out.
func checkCounterConfig(cfg server.StreamConfig) *server.ApiError {
	if !cfg.AllowMsgCounter {
		return nil
	}
	switch {
	case cfg.Discard == server.DiscardNew:
		return server.NewJSStreamInvalidConfigError(errors.New("counter stream cannot use discard new"))
	case cfg.AllowMsgTTL:
		return server.NewJSStreamInvalidConfigError(errors.New("counter stream cannot use message TTLs"))
	case cfg.AllowMsgSchedules:
		return server.NewJSStreamInvalidConfigError(errors.New("counter stream cannot use message schedules"))
	case cfg.Retention != server.LimitsPolicy:
		return server.NewJSStreamInvalidConfigError(errors.New("counter stream can only use limits retention"))
	}
	return nil
}
