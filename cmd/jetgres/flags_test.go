package main

import (
	"bufio"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

func envMap(kv ...string) func(string) (string, bool) {
	m := map[string]string{}
	for i := 0; i < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) (string, bool) {
		v, ok := m[k]
		return v, ok
	}
}

// TestEnvironmentVariables checks each setting's variables against the README's table,
// written out here rather than derived from the flag's name the way the code derives them.
func TestEnvironmentVariables(t *testing.T) {
	want := map[string][]string{
		"listen":              {"JETGRES_LISTEN"},
		"http":                {"JETGRES_HTTP"},
		"data-dir":            {"JETGRES_DATA_DIR"},
		"database-url":        {"JETGRES_DATABASE_URL", "DATABASE_URL"},
		"pg-start-failures":   {"JETGRES_PG_START_FAILURES"},
		"log-format":          {"JETGRES_LOG_FORMAT"},
		"log-level":           {"JETGRES_LOG_LEVEL"},
		"pool-size":           {"JETGRES_POOL_SIZE"},
		"stmt-timeout":        {"JETGRES_STMT_TIMEOUT"},
		"synchronous-commit":  {"JETGRES_SYNCHRONOUS_COMMIT"},
		"append-limit-init":   {"JETGRES_APPEND_LIMIT_INIT"},
		"append-limit-min":    {"JETGRES_APPEND_LIMIT_MIN"},
		"append-limit-max":    {"JETGRES_APPEND_LIMIT_MAX"},
		"pop-limit-init":      {"JETGRES_POP_LIMIT_INIT"},
		"pop-limit-min":       {"JETGRES_POP_LIMIT_MIN"},
		"pop-limit-max":       {"JETGRES_POP_LIMIT_MAX"},
		"ack-limit-init":      {"JETGRES_ACK_LIMIT_INIT"},
		"ack-limit-min":       {"JETGRES_ACK_LIMIT_MIN"},
		"ack-limit-max":       {"JETGRES_ACK_LIMIT_MAX"},
		"append-vegas-alpha":  {"JETGRES_APPEND_VEGAS_ALPHA"},
		"append-vegas-beta":   {"JETGRES_APPEND_VEGAS_BETA"},
		"vegas-alpha":         {"JETGRES_VEGAS_ALPHA"},
		"vegas-beta":          {"JETGRES_VEGAS_BETA"},
		"flush-overlap-after": {"JETGRES_FLUSH_OVERLAP_AFTER"},
		"tick-period":         {"JETGRES_TICK_PERIOD"},
		"cursor-interval":     {"JETGRES_CURSOR_INTERVAL"},
		"intake-bytes":        {"JETGRES_INTAKE_BYTES"},
		"intake-total-bytes":  {"JETGRES_INTAKE_TOTAL_BYTES"},
		"tail-total-bytes":    {"JETGRES_TAIL_TOTAL_BYTES"},
		"replica-name":        {"JETGRES_REPLICA_NAME"},
		"ready-file":          {"JETGRES_READY_FILE"},
		"ready-stall":         {"JETGRES_READY_STALL"},
		"shutdown-timeout":    {"JETGRES_SHUTDOWN_TIMEOUT"},
		"nats-config":         {"JETGRES_NATS_CONFIG"},
		"user":                {"JETGRES_USER"},
		"password":            {"JETGRES_PASSWORD"},
		"tls-cert":            {"JETGRES_TLS_CERT"},
		"tls-key":             {"JETGRES_TLS_KEY"},
		"tls-ca":              {"JETGRES_TLS_CA"},
		"tls-verify":          {"JETGRES_TLS_VERIFY"},
		"cluster":             {"JETGRES_CLUSTER"},
		"routes":              {"JETGRES_ROUTES"},
		"cluster-name":        {"JETGRES_CLUSTER_NAME"},
		"lease":               {"JETGRES_LEASE"},
		"js-domain":           {"JETGRES_JS_DOMAIN"},

		"subject-index-bytes": {"JETGRES_SUBJECT_INDEX_BYTES"},
	}
	var c config
	seen := map[string]bool{}
	for _, s := range c.settings() {
		if seen[s.name] {
			t.Errorf("flag --%s defined twice", s.name)
		}
		seen[s.name] = true
		w, ok := want[s.name]
		if !ok {
			t.Errorf("--%s is not in the table", s.name)
			continue
		}
		if !slices.Equal(s.env, w) {
			t.Errorf("--%s: environment variables %q, want %q", s.name, s.env, w)
		}
	}
	for name := range want {
		if !seen[name] {
			t.Errorf("no flag --%s", name)
		}
	}
}

// readmeRow is one row of the README's configuration table.
type readmeRow struct{ env, def, meaning string }

func readmeTable(t *testing.T) map[string]readmeRow {
	t.Helper()
	f, err := os.Open("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows := map[string]readmeRow{}
	clean := func(s string) string { return strings.Trim(strings.TrimSpace(s), "`*") }
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "| `--") {
			continue
		}
		cells := strings.Split(line, "|")
		if len(cells) < 5 {
			t.Fatalf("README row with too few cells: %s", line)
		}
		var envs []string
		for _, e := range strings.Split(cells[2], ",") {
			envs = append(envs, clean(e))
		}
		rows[strings.TrimPrefix(clean(cells[1]), "--")] = readmeRow{env: strings.Join(envs, ", "), def: clean(cells[3]), meaning: strings.Join(cells[4:len(cells)-1], "|")}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return rows
}

func TestReadmeConfigurationTableMatchesFlags(t *testing.T) {
	rows := readmeTable(t)
	var c config
	fs := newFlagSet(&c, io.Discard)
	for _, s := range c.settings() {
		row, ok := rows[s.name]
		if !ok {
			t.Errorf("README configuration table has no row for --%s", s.name)
			continue
		}
		delete(rows, s.name)
		if want := strings.Join(s.env, ", "); row.env != want {
			t.Errorf("README --%s: environment %q, want %q", s.name, row.env, want)
		}
		want := fs.Lookup(s.name).DefValue
		if want == "" {
			want = "(empty)"
		}
		if row.def != want {
			t.Errorf("README --%s: default %q, want %q", s.name, row.def, want)
		}
	}
	for name := range rows {
		t.Errorf("README lists --%s, which jetgres does not have", name)
	}
}

func TestParseConfigPrecedence(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  func(string) (string, bool)
		want func(c config) bool
	}{
		{"default", nil, envMap(),
			func(c config) bool {
				return c.Listen == "0.0.0.0:4222" && c.StmtTimeout == 30*time.Second && c.DatabaseURL == "" && c.SyncCommit == "on"
			}},
		{"env over default", nil, envMap("JETGRES_LISTEN", "127.0.0.1:1", "JETGRES_VEGAS_BETA", "7.5"),
			func(c config) bool { return c.Listen == "127.0.0.1:1" && c.VegasBeta == 7.5 }},
		{"flag over env", []string{"--listen", "127.0.0.1:2"}, envMap("JETGRES_LISTEN", "127.0.0.1:1"),
			func(c config) bool { return c.Listen == "127.0.0.1:2" }},
		{"DATABASE_URL alias", nil, envMap("DATABASE_URL", "postgres://a/b"),
			func(c config) bool { return c.DatabaseURL == "postgres://a/b" }},
		{"own variable over alias", nil, envMap("DATABASE_URL", "postgres://a/b", "JETGRES_DATABASE_URL", "postgres://c/d"),
			func(c config) bool { return c.DatabaseURL == "postgres://c/d" }},
		{"empty variable counts as unset", nil, envMap("JETGRES_DATABASE_URL", "", "DATABASE_URL", "postgres://a/b"),
			func(c config) bool { return c.DatabaseURL == "postgres://a/b" }},
		{"synchronous commit from the environment", nil, envMap("JETGRES_SYNCHRONOUS_COMMIT", "off"),
			func(c config) bool { return c.SyncCommit == "off" }},
		{"single dash flag", []string{"-stmt-timeout=5s"}, envMap(),
			func(c config) bool { return c.StmtTimeout == 5*time.Second }},
		{"security from the environment", nil, envMap("JETGRES_USER", "app", "JETGRES_PASSWORD", "$2a$11$x",
			"JETGRES_TLS_CERT", "c.pem", "JETGRES_TLS_KEY", "k.pem", "JETGRES_TLS_VERIFY", "true", "JETGRES_NATS_CONFIG", "n.conf"),
			func(c config) bool {
				return c.User == "app" && c.Password == "$2a$11$x" && c.TLSCert == "c.pem" && c.TLSKey == "k.pem" && c.TLSVerify && c.NATSConfig == "n.conf"
			}},
		{"boolean flag over environment", []string{"--tls-cert", "c.pem", "--tls-key", "k.pem", "--tls-verify=false"}, envMap("JETGRES_TLS_VERIFY", "true"),
			func(c config) bool { return !c.TLSVerify }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseConfig(tt.args, tt.env, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if !tt.want(c) {
				t.Errorf("unexpected config %+v", c)
			}
		})
	}
}

func TestParseConfigErrorsNameTheSource(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     func(string) (string, bool)
		mention string
	}{
		{"bad env value", nil, envMap("JETGRES_POOL_SIZE", "many"), "JETGRES_POOL_SIZE"},
		{"bad log format", []string{"--log-format", "xml"}, envMap(), "--log-format"},
		{"bad log level", []string{"--log-level", "loud"}, envMap(), "--log-level"},
		{"bad synchronous commit", []string{"--synchronous-commit", "local"}, envMap(), "--synchronous-commit"},
		{"bad listen", []string{"--listen", "4222"}, envMap(), "--listen"},
		{"zero pool", []string{"--pool-size", "0"}, envMap(), "--pool-size"},
		{"stray argument", []string{"extra"}, envMap(), "extra"},
		{"user without password", []string{"--user", "app"}, envMap(), "--password"},
		{"password without user", nil, envMap("JETGRES_PASSWORD", "secret"), "--user"},
		{"certificate without key", []string{"--tls-cert", "c.pem"}, envMap(), "--tls-key"},
		{"verify without certificate", []string{"--tls-verify"}, envMap(), "--tls-cert"},
		{"CA without certificate", nil, envMap("JETGRES_TLS_CA", "ca.pem"), "--tls-cert"},
		{"bad boolean", nil, envMap("JETGRES_TLS_VERIFY", "maybe"), "JETGRES_TLS_VERIFY"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseConfig(tt.args, tt.env, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tt.mention) {
				t.Fatalf("error %v does not mention %s", err, tt.mention)
			}
		})
	}
}

func TestSplitListen(t *testing.T) {
	tests := []struct {
		in   string
		host string
		port int
		ok   bool
	}{
		{"0.0.0.0:4222", "0.0.0.0", 4222, true},
		{"127.0.0.1:0", "127.0.0.1", -1, true},
		{"[::1]:5000", "::1", 5000, true},
		{":4222", "0.0.0.0", 4222, true},
		{"localhost", "", 0, false},
		{"127.0.0.1:70000", "", 0, false},
	}
	for _, tt := range tests {
		host, port, err := splitListen(tt.in)
		if (err == nil) != tt.ok || host != tt.host || port != tt.port {
			t.Errorf("splitListen(%q) = %q, %d, %v", tt.in, host, port, err)
		}
	}
}

func TestRunCommands(t *testing.T) {
	var out, errOut strings.Builder
	if code := run([]string{"version"}, &out, &errOut); code != 0 || !strings.HasPrefix(out.String(), "jetgres ") {
		t.Errorf("version: code %d, out %q, err %q", code, out.String(), errOut.String())
	}
	out.Reset()
	if code := run([]string{"help"}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "JETGRES_DATABASE_URL, DATABASE_URL") {
		t.Errorf("help: code %d, out %q", code, out.String())
	}
	if code := run([]string{"serve", "-h"}, &out, io.Discard); code != 0 {
		t.Errorf("serve -h: code %d", code)
	}
	if code := run([]string{"frobnicate"}, &out, io.Discard); code != 2 {
		t.Errorf("unknown command: code %d, want 2", code)
	}
	if code := run([]string{"--log-format", "xml"}, &out, io.Discard); code != 2 {
		t.Errorf("bad flag on bare jetgres: code %d, want 2", code)
	}
}

// A usage mistake is shown first and alone, with a one-line pointer to -h, not above (or
// below) the whole flag list; a bad duration shows the syntax; a bad environment variable
// shows its name and value.
func TestUsageErrorsComeFirst(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     []string
		mention []string
	}{
		{"unknown flag", []string{"--bogus"}, nil, []string{"-bogus"}},
		{"bad duration", []string{"--stmt-timeout", "5"}, nil, []string{"stmt-timeout", `"5"`, "500ms", "30s", "2m"}},
		{"bad duration in the environment", nil, []string{"JETGRES_SHUTDOWN_TIMEOUT", "soon"}, []string{`JETGRES_SHUTDOWN_TIMEOUT="soon"`, "500ms"}},
		{"bad number in the environment", nil, []string{"JETGRES_POOL_SIZE", "many"}, []string{`JETGRES_POOL_SIZE="many"`}},
		{"bad value", []string{"--log-format", "xml"}, nil, []string{"--log-format", "xml"}},
		{"unknown command", []string{"frobnicate"}, nil, []string{`"frobnicate"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for i := 0; i < len(tt.env); i += 2 {
				t.Setenv(tt.env[i], tt.env[i+1])
			}
			var out, errOut strings.Builder
			if code := run(tt.args, &out, &errOut); code != 2 {
				t.Fatalf("exit code %d, want 2; stderr:\n%s", code, errOut.String())
			}
			lines := strings.Split(strings.TrimSuffix(errOut.String(), "\n"), "\n")
			if len(lines) != 2 || !strings.HasPrefix(lines[0], "jetgres: ") || !strings.Contains(lines[1], "jetgres -h") {
				t.Fatalf("stderr is not the error and a pointer to -h:\n%s", errOut.String())
			}
			for _, m := range tt.mention {
				if !strings.Contains(lines[0], m) {
					t.Errorf("error %q does not mention %s", lines[0], m)
				}
			}
			if out.Len() > 0 {
				t.Errorf("stdout: %q", out.String())
			}
		})
	}
	var errOut strings.Builder
	if code := run([]string{"-h"}, io.Discard, &errOut); code != 0 || !strings.Contains(errOut.String(), "--stmt-timeout") {
		t.Errorf("-h: code %d, usage %q", code, errOut.String())
	}
}

var laneName = regexp.MustCompile(`\b(push|pop|ack)\b`)

// A setting that governs flow-control lanes names the same lanes in -h and in the README: the
// ack lane takes the append lane's limits (see node.start), and both must say so.
func TestReadmeAndHelpNameTheSameLanes(t *testing.T) {
	rows := readmeTable(t)
	var c config
	for _, s := range c.settings() {
		row := rows[s.name]
		if !strings.Contains(s.usage, "lane") && !strings.Contains(row.meaning, "lane") {
			continue
		}
		lanes := func(text string) []string {
			var names []string
			for _, m := range laneName.FindAllString(text, -1) {
				if !slices.Contains(names, m) {
					names = append(names, m)
				}
			}
			slices.Sort(names)
			return names
		}
		if help, readme := lanes(s.usage), lanes(row.meaning); !slices.Equal(help, readme) {
			t.Errorf("--%s: -h names the lanes %v, the README %v", s.name, help, readme)
		}
	}
	if got := laneName.FindAllString(rows["ack-limit-max"].meaning, -1); !slices.Contains(got, "ack") {
		t.Errorf("README: --ack-limit-max does not say it bounds the ack lane: %q", rows["ack-limit-max"].meaning)
	}
}
