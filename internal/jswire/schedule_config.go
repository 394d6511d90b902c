package jswire

import (
	"errors"

	"github.com/nats-io/nats-server/v2/server"
)

// checkScheduleConfig checks allow_msg_schedules as nats-server checks a request that is
// not pedantic: the schedule messages roll each other up on their subject, so schedules
// need roll-ups, which it turns on (and purges back on) rather than refuse; and a discard
// new stream could refuse the messages a schedule produces.
func checkScheduleConfig(cfg *server.StreamConfig) *server.ApiError {
	if !cfg.AllowMsgSchedules {
		return nil
	}
	if cfg.Discard == server.DiscardNew {
		return server.NewJSStreamInvalidConfigError(errors.New("message scheduling cannot use discard new"))
	}
	if !cfg.AllowRollup {
		cfg.AllowRollup, cfg.DenyPurge = true, false
	}
	return nil
}

// CheckScheduleUpdate refuses an update that turns message schedules off, as nats-server
// does.
func CheckScheduleUpdate(old, cfg *server.StreamConfig) *server.ApiError {
	if old.AllowMsgSchedules && !cfg.AllowMsgSchedules {
		return server.NewJSStreamInvalidConfigError(errors.New("message schedules can not be disabled"))
	}
	return nil
}
