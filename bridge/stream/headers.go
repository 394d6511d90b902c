package stream

import (
	"math"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/internal/jswire"
)

// checkHeaders refuses the headers of features a stream does not allow (counters, message
// TTLs, schedules, sourcing), and the malformed headers nats-server refuses before it looks
// at any expectation, with nats-server's errors and in nats-server's order: a client that
// sets two of them hears about the same one. The expected stream name sits between them in
// that order, so it is checked here too. subject and dataLen are the publish's.
func checkHeaders(cfg *server.StreamConfig, subject string, hdr []byte, dataLen int) *server.ApiError {
	// nats-server stores a header's length in 16 bits.
	if len(hdr) > math.MaxUint16 {
		return server.NewJSStreamHeaderExceedsMaximumError()
	}
	if e := checkIncr(cfg, hdr, dataLen); e != nil {
		return e
	}
	if v := jswire.HeaderValue(hdr, server.JSExpectedStream); v != "" && v != cfg.Name {
		return server.NewJSStreamNotMatchError()
	}
	if ttl, ok := parseTTL(jswire.HeaderValue(hdr, server.JSMessageTTL)); ok && ttl != 0 && !cfg.AllowMsgTTL {
		return server.NewJSMessageTTLDisabledError()
	}
	if jswire.HeaderValue(hdr, server.JSExpectedLastSubjSeq) == "" && jswire.HeaderValue(hdr, server.JSExpectedLastSubjSeqSubj) != "" {
		return server.NewJSStreamExpectedLastSeqPerSubjectInvalidError()
	}
	if _, e := checkSchedule(cfg, subject, hdr); e != nil {
		return e
	}
	if next := jswire.HeaderValue(hdr, server.JSScheduleNext); next != "" {
		// A client's Nats-Schedule-Next may only purge a schedule, which its append does
		// (schedulePurge).
		scheduler := jswire.HeaderValue(hdr, server.JSScheduler)
		if next != server.JSScheduleNextPurge || scheduler == "" || scheduler == subject || !server.IsValidPublishSubject(scheduler) {
			return server.NewJSMessageSchedulesSchedulerInvalidError()
		}
		if !cfg.AllowMsgSchedules {
			return server.NewJSMessageSchedulesDisabledError()
		}
		return nil
	}
	if jswire.HeaderValue(hdr, server.JSScheduler) != "" {
		return server.NewJSMessageSchedulesSchedulerInvalidError()
	}
	if jswire.HeaderValue(hdr, server.JSStreamSource) != "" {
		return server.NewJSMessageSourceHdrNotAllowedError()
	}
	return nil
}

// schedules reports whether a publish asks for a message schedule: a Nats-Schedule of any
// value, or a schedule time zone that names no zone. On a stream without schedules
// nats-server refuses both, whether the schedule would parse or not.
func schedules(hdr []byte) bool {
	if jswire.HeaderValue(hdr, server.JSSchedulePattern) != "" {
		return true
	}
	if tz := jswire.HeaderValue(hdr, server.JSScheduleTimeZone); tz != "" {
		_, err := time.LoadLocation(tz)
		return err != nil
	}
	return false
}

// parseTTL reads a Nats-TTL value as nats-server does: seconds, -1 for "never", 0 for no
// header; ok is false for a value it refuses as invalid (a duration under a second, or
// neither a duration nor a plain number).
func parseTTL(v string) (ttl int64, ok bool) {
	if v == "" {
		return 0, true
	}
	if strings.EqualFold(v, "never") {
		return -1, true
	}
	if d, err := time.ParseDuration(v); err == nil {
		if d < time.Second {
			return 0, false
		}
		return int64(d.Seconds()), true
	}
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, false
		}
		ttl = ttl*10 + int64(v[i]-'0')
	}
	return ttl, true
}
