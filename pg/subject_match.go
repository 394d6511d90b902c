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
	if prefixes, ok := subjectPrefixes(filters); ok {
		return fmt.Sprintf(` AND subject ^@ ANY($%d::text[])`, arg), prefixes
	}
	res := make([]string, len(filters))
	for i, f := range filters {
		res[i] = SubjectRegexp(f)
	}
	return fmt.Sprintf(` AND subject ~ ANY($%d::text[])`, arg), res
}

// subjectPrefixes returns, when every filter is literal tokens and a final ">" (as every
// key-value and object store reader's is), what the subjects they match start with:
// "a.b.>" matches the stored subjects that start with "a.b.", since none ends in a dot.
// PostgreSQL tests a prefix at the cost of a comparison, where the regular expression cost
// it about a microsecond a row: on a bucket of 100,000 keys, counting them as pending took
// 140 ms with it and 58 ms with the prefix, listing the last sequence of each 277 and 167.
func subjectPrefixes(filters []string) ([]string, bool) {
	out := make([]string, len(filters))
	for i, f := range filters {
		prefix, ok := strings.CutSuffix(f, ">")
		if !ok || !strings.HasSuffix(prefix, ".") || strings.ContainsAny(prefix, "*>") {
			return nil, false
		}
		out[i] = prefix
	}
	return out, true
}
