package main

import (
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"strings"
)

const redacted = "xxxxx"

// newLogger builds the process logger. Every string it writes, whichever package logged it
// and including error texts, has the given secrets replaced: a driver or server error that
// quotes a connection string must not leak the database password into the logs.
func newLogger(c config, w io.Writer, secrets []string) (*slog.Logger, error) {
	level, err := c.logLevel()
	if err != nil {
		return nil, err
	}
	scrub := scrubber(secrets)
	opts := &slog.HandlerOptions{
		Level: level,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			switch a.Value.Kind() {
			case slog.KindString:
				a.Value = slog.StringValue(scrub(a.Value.String()))
			case slog.KindAny:
				switch v := a.Value.Any().(type) {
				case error:
					a.Value = slog.StringValue(scrub(v.Error()))
				case fmt.Stringer:
					a.Value = slog.StringValue(scrub(v.String()))
				}
			}
			return a
		},
	}
	if c.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return slog.New(slog.NewTextHandler(w, opts)), nil
}

func scrubber(secrets []string) func(string) string {
	var pairs []string
	for _, s := range secrets {
		if s != "" {
			pairs = append(pairs, s, redacted)
			// url.URL.String percent-encodes a password, so look for that spelling too.
			if e := url.QueryEscape(s); e != s {
				pairs = append(pairs, e, redacted)
			}
			if e := url.PathEscape(s); e != s {
				pairs = append(pairs, e, redacted)
			}
		}
	}
	if len(pairs) == 0 {
		return func(s string) string { return s }
	}
	r := strings.NewReplacer(pairs...)
	return r.Replace
}

// databaseSecrets returns the passwords that a connection with databaseURL may use: the one
// inside the URL or keyword/value DSN, and PGPASSWORD, which libpq-style drivers fall back to.
func databaseSecrets(databaseURL string) []string {
	var out []string
	if p := os.Getenv("PGPASSWORD"); p != "" {
		out = append(out, p)
	}
	if u, err := url.Parse(databaseURL); err == nil && u.Scheme != "" {
		if p, ok := u.User.Password(); ok && p != "" {
			out = append(out, p, rawURLPassword(databaseURL))
		}
		if p := u.Query().Get("password"); p != "" {
			out = append(out, p)
		}
		return out
	}
	if p := dsnPassword(databaseURL); p != "" {
		out = append(out, p)
	}
	return out
}

// rawURLPassword returns the password of a URL as it is spelled there, percent-encoding and
// all, which may differ from how url.URL would encode it again.
func rawURLPassword(u string) string {
	_, rest, ok := strings.Cut(u, "://")
	if !ok {
		return ""
	}
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		rest = rest[:i]
	}
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		return ""
	}
	_, pw, _ := strings.Cut(rest[:at], ":")
	return pw
}

// dsnPassword finds password=... in a keyword/value DSN such as
// "host=db user=app password='my secret'", where a quoted value escapes a quote with a
// backslash or by doubling it, as libpq does.
func dsnPassword(dsn string) string {
	const key = "password"
	for i := 0; i < len(dsn); {
		j := strings.Index(dsn[i:], key)
		if j < 0 {
			return ""
		}
		j += i
		rest := strings.TrimLeft(dsn[j+len(key):], " \t")
		startsWord := j == 0 || dsn[j-1] == ' ' || dsn[j-1] == '\t'
		if !startsWord || !strings.HasPrefix(rest, "=") {
			i = j + len(key)
			continue
		}
		rest = strings.TrimLeft(rest[1:], " \t")
		if strings.HasPrefix(rest, "'") {
			var b strings.Builder
			for k := 1; k < len(rest); k++ {
				switch {
				case rest[k] == '\\' && k+1 < len(rest):
					k++
					b.WriteByte(rest[k])
				case rest[k] == '\'' && k+1 < len(rest) && rest[k+1] == '\'':
					k++
					b.WriteByte('\'')
				case rest[k] == '\'':
					return b.String()
				default:
					b.WriteByte(rest[k])
				}
			}
			return b.String()
		}
		if end := strings.IndexAny(rest, " \t"); end >= 0 {
			return rest[:end]
		}
		return rest
	}
	return ""
}

// redactDatabaseURL makes a database URL fit for a log line.
func redactDatabaseURL(databaseURL string) string {
	return scrubber(databaseSecrets(databaseURL))(databaseURL)
}
