package stream

import (
	"slices"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/bridge/schedule/pattern"
	"github.com/jetgres/jetgres/internal/jswire"
	"github.com/jetgres/jetgres/pg"
)

// checkSchedule refuses a message schedule (Nats-Schedule and its headers) as nats-server
// refuses one, in its order; on a stream without allow_msg_schedules, any schedule.
// isSchedule says the publish is a schedule message, which is stored with a subject
// roll-up: the newest schedule of a subject replaces the one before.
func checkSchedule(cfg *server.StreamConfig, subject string, hdr []byte) (isSchedule bool, e *server.ApiError) {
	if !cfg.AllowMsgSchedules {
		if schedules(hdr) {
			return false, server.NewJSMessageSchedulesDisabledError()
		}
		return false, nil
	}
	p := jswire.HeaderValue(hdr, server.JSSchedulePattern)
	tz := jswire.HeaderValue(hdr, server.JSScheduleTimeZone)
	loc, ok := pattern.Location(tz, tz != "")
	if !ok {
		return false, server.NewJSMessageSchedulesTimeZoneInvalidError()
	}
	if p == "" {
		return false, nil
	}
	if !pattern.Valid(p, loc) {
		return false, server.NewJSMessageSchedulesPatternInvalidError()
	}
	ttl := jswire.HeaderValue(hdr, server.JSScheduleTTL)
	if _, ok := parseTTL(ttl); !ok {
		return false, server.NewJSMessageSchedulesTTLInvalidError()
	}
	if r := jswire.HeaderValue(hdr, server.JSScheduleRollup); r != "" && r != server.JSMsgRollupSubject {
		return false, server.NewJSMessageSchedulesRollupInvalidError()
	}
	if ttl != "" && !cfg.AllowMsgTTL {
		return false, server.NewJSMessageTTLDisabledError()
	}
	target := jswire.HeaderValue(hdr, server.JSScheduleTarget)
	if target == "" || !server.IsValidPublishSubject(target) || target == subject {
		return false, server.NewJSMessageSchedulesTargetInvalidError()
	}
	source := jswire.HeaderValue(hdr, server.JSScheduleSource)
	if source != "" && (source == target || source == subject || !server.IsValidPublishSubject(source)) {
		return false, server.NewJSMessageSchedulesSourceInvalidError()
	}
	if !collides(cfg.Subjects, target) {
		return false, server.NewJSMessageSchedulesTargetInvalidError()
	}
	if source != "" && !collides(cfg.Subjects, source) {
		return false, server.NewJSMessageSchedulesSourceInvalidError()
	}
	if r := jswire.HeaderValue(hdr, server.JSMsgRollup); r != "" && r != server.JSMsgRollupSubject {
		return false, server.NewJSMessageSchedulesRollupInvalidError()
	}
	return true, nil
}

// collides reports whether subject lies in one of a stream's subjects.
func collides(subjects []string, subject string) bool {
	return slices.ContainsFunc(subjects, func(s string) bool { return server.SubjectsCollide(s, subject) })
}

// ValidTTL reports whether nats-server takes v as a Nats-TTL (or a Nats-Schedule-TTL); no
// TTL is valid.
func ValidTTL(v string) bool {
	_, ok := parseTTL(v)
	return ok
}

// Produced is the append of a message that the schedule stored at seq on the subject
// schedule produced (bridge/schedule): stored as nats-server stores it, as a message whose
// schedule headers its schedule vouched for, with its Nats-TTL and Nats-Rollup applied.
// It is stored only while the schedule is still the last message of its subject, so that a
// time fires once whichever replica fires it, even one whose session broke as it appended;
// and a one-shot's (Nats-Schedule-Next: purge) purges the schedule in its own transaction.
func Produced(cfg *server.StreamConfig, schedule string, seq uint64, subject string, hdr, data []byte) pg.AppendMsg {
	m := pg.AppendMsg{Subject: subject, Header: hdr, Data: data, ExpectLastSubjSeq: &seq, ExpectLastSubjFilter: schedule}
	if ttl, ok := parseTTL(jswire.HeaderValue(hdr, server.JSMessageTTL)); ok {
		setTTL(cfg, &m, ttl)
	}
	if jswire.HeaderValue(hdr, server.JSMsgRollup) == server.JSMsgRollupSubject {
		m.Rollup = pg.RollupSubject
	}
	if jswire.HeaderValue(hdr, server.JSScheduleNext) == server.JSScheduleNextPurge {
		m.Purge = schedule
	}
	return m
}

// schedulePurge makes a client's "Nats-Schedule-Next: purge", which checkHeaders let
// through, purge its Nats-Scheduler's subject as it is stored, as nats-server does; the
// append refuses it when that subject's last message is not a schedule (purgesSchedule).
func schedulePurge(hdr []byte, m *pg.AppendMsg) {
	if jswire.HeaderValue(hdr, server.JSScheduleNext) != server.JSScheduleNextPurge {
		return
	}
	m.Purge = jswire.HeaderValue(hdr, server.JSScheduler)
	m.PurgeCheck = purgesSchedule
}

// purgesSchedule refuses a client's purge of a subject whose last message is not a
// schedule, as nats-server 2.15 does under its stream's lock; a subject without any is
// purged all the same, which nats-server keeps for clients that purged before it checked.
func purgesSchedule(last *pg.Message) error {
	if last != nil && jswire.HeaderValue(last.Header, server.JSSchedulePattern) == "" {
		return server.NewJSMessageSchedulesSchedulerInvalidError()
	}
	return nil
}
