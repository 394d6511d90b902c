package pattern

import (
	"testing"
	"time"
)

func TestNext(t *testing.T) {
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Skip("no time zone database:", err)
	}
	utc := func(s string) time.Time {
		t.Helper()
		v, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, c := range []struct {
		pattern string
		loc     *time.Location
		from    string // when the schedule was stored, and now unless now is set
		now     string
		want    string // "" for a pattern refused
		repeat  bool
	}{
		{pattern: "@at 2027-01-02T03:04:05Z", from: "2026-12-07T10:00:00Z", want: "2027-01-02T03:04:05Z"},
		{pattern: "@at 2020-01-02T03:04:05Z", from: "2026-12-07T10:00:00Z", want: "2020-01-02T03:04:05Z"},
		{pattern: "@at tomorrow", from: "2026-12-07T10:00:00Z"},
		{pattern: "@at 2027-01-02T03:04:05Z", loc: paris, from: "2026-12-07T10:00:00Z"},
		{pattern: "@every 5s", from: "2026-12-07T10:00:00.4Z", want: "2026-12-07T10:00:05Z", repeat: true},
		{pattern: "@every 5s", from: "2026-12-07T10:00:00.6Z", want: "2026-12-07T10:00:06Z", repeat: true},
		// Missed while stopped: once, a period after now.
		{pattern: "@every 1m", from: "2026-12-07T10:00:00Z", now: "2026-12-07T11:30:10Z", want: "2026-12-07T11:31:10Z", repeat: true},
		{pattern: "@every 500ms", from: "2026-12-07T10:00:00Z"},
		{pattern: "@every 1m", loc: paris, from: "2026-12-07T10:00:00Z"},
		{pattern: "*/15 * * * * *", from: "2026-12-07T12:00:07Z", want: "2026-12-07T12:00:15Z", repeat: true},
		{pattern: "0 30 9 * * mon-fri", from: "2026-12-05T10:00:00Z", want: "2026-12-07T09:30:00Z", repeat: true},
		{pattern: "0 30 9 * * MON-FRI", from: "2026-12-07T09:30:00Z", want: "2026-12-08T09:30:00Z", repeat: true},
		{pattern: "0 0 0 1 jan *", from: "2026-06-01T00:00:00Z", want: "2027-01-01T00:00:00Z", repeat: true},
		{pattern: "@yearly", from: "2026-06-01T00:00:00Z", want: "2027-01-01T00:00:00Z", repeat: true},
		{pattern: "@hourly", from: "2026-06-01T10:59:59Z", want: "2026-06-01T11:00:00Z", repeat: true},
		{pattern: "@weekly", from: "2026-12-07T10:00:00Z", want: "2026-12-13T00:00:00Z", repeat: true},
		// Both day fields restricted: either matches (Friday the 11th comes before the 13th).
		{pattern: "0 0 0 13 * fri", from: "2026-12-07T10:00:00Z", want: "2026-12-11T00:00:00Z", repeat: true},
		// One of them "*": both must.
		{pattern: "0 0 0 * * fri", from: "2026-12-07T10:00:00Z", want: "2026-12-11T00:00:00Z", repeat: true},
		{pattern: "0 0 0 13 * *", from: "2026-12-07T10:00:00Z", want: "2026-12-13T00:00:00Z", repeat: true},
		{pattern: "0 0 12 5/10 * *", from: "2026-12-07T10:00:00Z", want: "2026-12-15T12:00:00Z", repeat: true},
		{pattern: "0 0,30 8-9 * * *", from: "2026-12-07T08:10:00Z", want: "2026-12-07T08:30:00Z", repeat: true},
		{pattern: "0 0 9 * * *", loc: paris, from: "2026-12-07T07:00:00Z", want: "2026-12-07T08:00:00Z", repeat: true},
		{pattern: "0 0 9 * * *", loc: paris, from: "2026-07-07T06:00:00Z", want: "2026-07-07T07:00:00Z", repeat: true},
		// A cron time missed: the first after now.
		{pattern: "0 0 * * * *", from: "2026-12-07T10:00:00Z", now: "2026-12-07T13:20:00Z", want: "2026-12-07T14:00:00Z", repeat: true},
		{pattern: "0 0 0 30 feb *", from: "2026-12-07T10:00:00Z"},
		{pattern: "61 * * * * *", from: "2026-12-07T10:00:00Z"},
		{pattern: "* * * * *", from: "2026-12-07T10:00:00Z"},
		{pattern: "1-2-3 * * * * *", from: "2026-12-07T10:00:00Z"},
		{pattern: "*/0 * * * * *", from: "2026-12-07T10:00:00Z"},
		{pattern: "5-1 * * * * *", from: "2026-12-07T10:00:00Z"},
		{pattern: "0 0 0 * * 7", from: "2026-12-07T10:00:00Z"},
		{pattern: "-1 * * * * *", from: "2026-12-07T10:00:00Z"},
		{pattern: "", from: "2026-12-07T10:00:00Z"},
	} {
		from := utc(c.from)
		now := from
		if c.now != "" {
			now = utc(c.now)
		}
		next, repeat, ok := Next(c.pattern, c.loc, from.UnixNano(), now)
		switch {
		case c.want == "" && ok:
			t.Errorf("%q: taken, next %v; want refused", c.pattern, next)
		case c.want == "":
		case !ok:
			t.Errorf("%q from %s: refused, want %s", c.pattern, c.from, c.want)
		case !next.Equal(utc(c.want)) || repeat != c.repeat:
			t.Errorf("%q from %s: %v (repeat %t), want %s (repeat %t)", c.pattern, c.from, next.UTC(), repeat, c.want, c.repeat)
		}
		if Valid(c.pattern, c.loc) != (c.want != "") {
			t.Errorf("%q: Valid %t", c.pattern, !(c.want != ""))
		}
	}
}
