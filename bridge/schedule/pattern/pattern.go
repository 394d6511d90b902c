// Package pattern reads the schedule of a message schedule as nats-server 2.15 reads its
// Nats-Schedule header: "@at <RFC 3339 time>" fires once; "@every <Go duration>" (a second
// or more) and cron expressions repeat. A cron expression has six fields, second, minute,
// hour, day of month, month and day of week, each a list of values, ranges (a-b), steps
// (*/n, a-b/n, a/n for a to the field's end), "*" or "?"; months and days of the week may
// be named (jan, mon). When day of month and day of week are both restricted, a day that
// matches either matches; otherwise both must. @yearly (@annually), @monthly, @weekly,
// @daily (@midnight) and @hourly stand for their cron expressions. Cron times are in UTC,
// or in the zone a Nats-Schedule-Time-Zone header names, which @at and @every refuse.
//
// It keeps nothing and has no locks; the clock is the caller's.
package pattern

import (
	"strings"
	"time"
)

// Next is when the schedule pattern fires next, counting from ts (unix ns): for a
// repeating one the first time after ts, or, when that lies before now (the schedule was
// missed, as over a restart), the first after now, so that it fires once rather than for
// every time missed. repeat says whether it repeats; ok is false for a pattern nats-server
// refuses. loc is the Nats-Schedule-Time-Zone's zone, nil for none.
func Next(p string, loc *time.Location, ts int64, now time.Time) (next time.Time, repeat, ok bool) {
	if at, found := strings.CutPrefix(p, "@at "); found {
		if loc != nil {
			return time.Time{}, false, false
		}
		t, err := time.Parse(time.RFC3339, at)
		return t, false, err == nil
	}
	if every, found := strings.CutPrefix(p, "@every "); found {
		if loc != nil {
			return time.Time{}, false, false
		}
		d, err := time.ParseDuration(every)
		if err != nil || d < time.Second {
			return time.Time{}, false, false
		}
		next = time.Unix(0, ts).UTC().Round(time.Second).Add(d)
		if n := now.UTC(); next.Before(n) {
			next = n.Round(time.Second).Add(d)
		}
		return next, true, true
	}
	if p == "" {
		return time.Time{}, false, false
	}
	if alias, found := aliases[p]; found {
		p = alias
	}
	c, err := parseCron(p)
	if err != nil {
		return time.Time{}, false, false
	}
	if loc == nil {
		loc = time.UTC
	}
	next, ok = c.after(time.Unix(0, ts).In(loc))
	if !ok {
		return time.Time{}, false, false
	}
	if n := now.UTC(); next.Before(n) {
		if next, ok = c.after(n.Round(time.Second).In(loc)); !ok {
			return time.Time{}, false, false
		}
	}
	return next, true, true
}

// Valid reports whether nats-server takes p, with the zone loc, as a schedule: whether
// it reads and, for a cron expression, matches a time within five years, which does not
// depend on when it is asked.
func Valid(p string, loc *time.Location) bool {
	epoch := time.Unix(0, 0)
	_, _, ok := Next(p, loc, 0, epoch)
	return ok
}

// aliases are the named cron expressions.
var aliases = map[string]string{
	"@yearly":   "0 0 0 1 1 *",
	"@annually": "0 0 0 1 1 *",
	"@monthly":  "0 0 0 1 * *",
	"@weekly":   "0 0 0 * * 0",
	"@daily":    "0 0 0 * * *",
	"@midnight": "0 0 0 * * *",
	"@hourly":   "0 0 * * * *",
}

// Location is the zone a Nats-Schedule-Time-Zone value names: nil when the header is
// absent (present says whether it is); ok is false for an empty value or an unknown zone.
func Location(tz string, present bool) (loc *time.Location, ok bool) {
	if !present {
		return nil, true
	}
	if tz == "" {
		return nil, false
	}
	loc, err := time.LoadLocation(tz)
	return loc, err == nil
}
