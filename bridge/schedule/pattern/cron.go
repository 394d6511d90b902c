package pattern

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// cron is a parsed cron expression: for each field, a bit per value it matches.
type cron struct {
	sec, min, hour, dom, month, dow uint64
	// domAny and dowAny say the field was "*" or "?" without a step: a day then has to
	// match both day fields, and otherwise either.
	domAny, dowAny bool
}

// field is the range of values of one cron field, and its names.
type field struct {
	lo, hi uint
	names  map[string]uint
}

var (
	fieldSec   = field{0, 59, nil}
	fieldMin   = field{0, 59, nil}
	fieldHour  = field{0, 23, nil}
	fieldDom   = field{1, 31, nil}
	fieldMonth = field{1, 12, map[string]uint{"jan": 1, "feb": 2, "mar": 3, "apr": 4, "may": 5, "jun": 6,
		"jul": 7, "aug": 8, "sep": 9, "oct": 10, "nov": 11, "dec": 12}}
	fieldDow = field{0, 6, map[string]uint{"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6}}
)

// searchYears bounds the search for the next time, as nats-server's: an expression that
// matches no time within it (the 30th of February) is refused.
const searchYears = 5

func parseCron(expr string) (*cron, error) {
	parts := strings.Fields(expr)
	if len(parts) != 6 {
		return nil, fmt.Errorf("pattern requires 6 fields, got %d", len(parts))
	}
	var c cron
	var err error
	if c.sec, _, err = fieldSec.parse(parts[0]); err != nil {
		return nil, err
	}
	if c.min, _, err = fieldMin.parse(parts[1]); err != nil {
		return nil, err
	}
	if c.hour, _, err = fieldHour.parse(parts[2]); err != nil {
		return nil, err
	}
	if c.dom, c.domAny, err = fieldDom.parse(parts[3]); err != nil {
		return nil, err
	}
	if c.month, _, err = fieldMonth.parse(parts[4]); err != nil {
		return nil, err
	}
	if c.dow, c.dowAny, err = fieldDow.parse(parts[5]); err != nil {
		return nil, err
	}
	return &c, nil
}

// parse reads a comma-separated list of ranges; any says one of them was an unstepped
// "*" or "?". Empty list items are passed over, as nats-server passes them.
func (f field) parse(s string) (bits uint64, any bool, err error) {
	for r := range strings.SplitSeq(s, ",") {
		if r == "" {
			continue
		}
		b, a, err := f.parseRange(r)
		if err != nil {
			return 0, false, err
		}
		bits |= b
		any = any || a
	}
	return bits, any, nil
}

func (f field) parseRange(r string) (bits uint64, any bool, err error) {
	span, stepText, stepped := strings.Cut(r, "/")
	if stepped && strings.Contains(stepText, "/") {
		return 0, false, fmt.Errorf("too many slashes: %s", r)
	}
	var lo, hi uint
	switch {
	case span == "*" || span == "?":
		lo, hi, any = f.lo, f.hi, true
	default:
		first, last, isRange := strings.Cut(span, "-")
		if isRange && strings.Contains(last, "-") {
			return 0, false, fmt.Errorf("too many hyphens: %s", r)
		}
		if lo, err = f.value(first); err != nil {
			return 0, false, err
		}
		hi = lo
		switch {
		case isRange:
			if hi, err = f.value(last); err != nil {
				return 0, false, err
			}
		case stepped:
			hi = f.hi
		}
	}
	step := uint(1)
	if stepped {
		if step, err = number(stepText); err != nil {
			return 0, false, err
		}
		if step > 1 {
			any = false
		}
	}
	switch {
	case lo < f.lo:
		return 0, false, fmt.Errorf("beginning of range (%d) below minimum (%d): %s", lo, f.lo, r)
	case hi > f.hi:
		return 0, false, fmt.Errorf("end of range (%d) above maximum (%d): %s", hi, f.hi, r)
	case lo > hi:
		return 0, false, fmt.Errorf("beginning of range (%d) beyond end of range (%d): %s", lo, hi, r)
	case step == 0:
		return 0, false, fmt.Errorf("step of range should be a positive number: %s", r)
	}
	for v := lo; v <= hi; v += step {
		bits |= 1 << v
	}
	return bits, any, nil
}

// value is a number or, in fields that have them, a name.
func (f field) value(s string) (uint, error) {
	if v, ok := f.names[strings.ToLower(s)]; ok {
		return v, nil
	}
	return number(s)
}

func number(s string) (uint, error) {
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("failed to parse int from %s: %w", s, err)
	}
	if n < 0 {
		return 0, fmt.Errorf("negative number (%d) not allowed: %s", n, s)
	}
	return uint(n), nil
}

// after is the first time after t, to the second, that c matches, in t's zone.
func (c *cron) after(t time.Time) (time.Time, bool) {
	t = t.Truncate(time.Second).Add(time.Second)
	limit := t.Year() + searchYears
	loc := t.Location()
	for t.Year() <= limit {
		var n time.Time
		switch {
		case c.month&(1<<uint(t.Month())) == 0:
			n = time.Date(t.Year(), t.Month()+1, 1, 0, 0, 0, 0, loc)
		case !c.dayMatches(t):
			n = time.Date(t.Year(), t.Month(), t.Day()+1, 0, 0, 0, 0, loc)
		case c.hour&(1<<uint(t.Hour())) == 0:
			n = t.Add(time.Hour - time.Duration(t.Minute())*time.Minute - time.Duration(t.Second())*time.Second)
		case c.min&(1<<uint(t.Minute())) == 0:
			n = t.Add(time.Minute - time.Duration(t.Second())*time.Second)
		case c.sec&(1<<uint(t.Second())) == 0:
			n = t.Add(time.Second)
		default:
			return t, true
		}
		// A day or month that begins in a daylight-saving gap may be placed before t: move
		// on by an hour rather than go back.
		if !n.After(t) {
			n = t.Add(time.Hour)
		}
		t = n
	}
	return time.Time{}, false
}

// dayMatches applies cron's rule for the two day fields.
func (c *cron) dayMatches(t time.Time) bool {
	dom := c.dom&(1<<uint(t.Day())) != 0
	dow := c.dow&(1<<uint(t.Weekday())) != 0
	if c.domAny || c.dowAny {
		return dom && dow
	}
	return dom || dow
}
