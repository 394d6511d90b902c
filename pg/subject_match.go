package pg

import (
	"regexp"
	"strings"
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

// SubjectMatches reports whether a literal subject matches a filter with wildcards.
func SubjectMatches(filter, subject string) bool {
	if filter == subject || filter == ">" {
		return true
	}
	for {
		ft, frest, fmore := strings.Cut(filter, ".")
		st, srest, smore := strings.Cut(subject, ".")
		switch {
		case ft == ">":
			return true
		case ft != "*" && ft != st:
			return false
		}
		if !fmore || !smore {
			return fmore == smore
		}
		filter, subject = frest, srest
	}
}
