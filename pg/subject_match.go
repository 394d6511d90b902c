package pg

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
)

// SubjectRegexp turns a NATS subject filter into an anchored POSIX regular expression.
func SubjectRegexp(filter string) string {
	toks := strings.Split(filter, ".")
	var sb strings.Builder
	sb.WriteString("^")
	for i, t := range toks {
		if i > 0 {
			sb.WriteString(`\.`)
		}
		switch t {
		case "*":
			sb.WriteString(`[^.]+`)
		case ">":
			sb.WriteString(`.+`)
		default:
			sb.WriteString(regexp.QuoteMeta(t))
		}
	}
	sb.WriteString("$")
	return sb.String()
}

// SubjectMatches reports whether a literal subject matches a filter with wildcards, by
// nats-server's own rule, so that what pg selects in Go agrees with what the server routes.
func SubjectMatches(filter, subject string) bool {
	return server.SubjectMatchesFilter(subject, filter)
}

// subjectMatch is SQL that a chunk row m's subject matches filter, with its argument as
// placeholder $n: equality for a literal subject, so that the (subject, seq) index serves
// it, a regular expression otherwise. An empty or full-wildcard filter matches everything.
func subjectMatch(filter string, n int) (string, any) {
	switch {
	case filter == "" || filter == ">":
		return fmt.Sprintf(`$%d::text IS NULL`, n), nil
	case strings.ContainsAny(filter, "*>"):
		return fmt.Sprintf(`m.subject ~ $%d`, n), SubjectRegexp(filter)
	default:
		return fmt.Sprintf(`m.subject = $%d`, n), filter
	}
}

// subjectCond is the SQL condition (and its argument) that a subject matches any of filters;
// no filters, or a full wildcard among them, match everything.
func subjectCond(filters []string, arg int) (string, any) {
	if len(filters) == 0 || slices.Contains(filters, ">") {
		return "", nil
	}
	// Literal subjects compare as equal, which the subject index serves; patterns cannot
	// use it.
	if !slices.ContainsFunc(filters, func(f string) bool { return strings.ContainsAny(f, "*>") }) {
		return fmt.Sprintf(` AND subject = ANY($%d::text[])`, arg), filters
	}
	res := make([]string, len(filters))
	for i, f := range filters {
		res[i] = SubjectRegexp(f)
	}
	return fmt.Sprintf(` AND subject ~ ANY($%d::text[])`, arg), res
}
