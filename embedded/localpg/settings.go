package localpg

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// defaultSettings suit a queue: many short transactions that insert and read recent rows.
//
//   - max_connections stays at the stock 100, which the pool default in package pg is sized for.
//   - shared_buffers is the stock 128MB: modest, so the cluster fits beside jetgres on a small
//     machine; raise it with ALTER SYSTEM on a dedicated one.
//   - A larger max_wal_size and a longer checkpoint_timeout spread checkpoints out, so a steady
//     insert load does not pay for a full-page write of every touched page every few minutes;
//     wal_compression shrinks the full-page writes that remain.
//   - jit is off: queue statements are short, and JIT compilation can cost more than a
//     whole range read.
//   - idle_in_transaction_session_timeout ends a session that holds a transaction open while
//     doing nothing, since such a transaction would hold a stream's row lock and pin the
//     xmin horizon that vacuum needs.
//   - synchronous_commit stays on: a PubAck promises the message is durable.
var defaultSettings = map[string]string{
	"max_connections":                     "100",
	"shared_buffers":                      "128MB",
	"max_wal_size":                        "2GB",
	"min_wal_size":                        "256MB",
	"checkpoint_timeout":                  "15min",
	"checkpoint_completion_target":        "0.9",
	"wal_compression":                     "on",
	"jit":                                 "off",
	"idle_in_transaction_session_timeout": "5min",
	"synchronous_commit":                  "on",
}

// enforcedSettings are passed on the command line, where neither Config.Settings nor ALTER SYSTEM
// can change them: the first four keep the cluster private, the last three keep its log readable
// by logServer.
func enforcedSettings(socketDir string) map[string]string {
	return map[string]string{
		"listen_addresses":        "",
		"unix_socket_directories": `"` + socketDir + `"`,
		"unix_socket_permissions": "0700",
		"port":                    "5432",
		"logging_collector":       "off",
		"log_destination":         "stderr",
		"log_line_prefix":         "[%p] ",
	}
}

// confFileName is the file jetgres rewrites at every start; postgresql.conf includes it.
const confFileName = "jetgres.conf"

const includeLine = "\n# Settings jetgres chooses; ALTER SYSTEM (postgresql.auto.conf) overrides them.\ninclude_if_exists '" + confFileName + "'\n"

var settingNameRE = regexp.MustCompile(`^[a-z_][a-z0-9_.]*$`)

// mergeSettings applies the caller's settings over the defaults and refuses the enforced ones,
// so a test cannot accidentally open a TCP listener on a trust-authenticated cluster.
func mergeSettings(extra map[string]string, enforced map[string]string) (map[string]string, error) {
	merged := maps.Clone(defaultSettings)
	for k, v := range extra {
		name := strings.ToLower(k)
		if !settingNameRE.MatchString(name) {
			return nil, fmt.Errorf("Config.Settings: %q is not a setting name", k)
		}
		if _, ok := enforced[name]; ok {
			return nil, fmt.Errorf("Config.Settings: %s is managed by localpg and cannot be set", name)
		}
		merged[name] = v
	}
	return merged, nil
}

// writeConf writes the settings file owned by the server's user, since the server reads it.
func writeConf(dataDir string, settings map[string]string, u osUser) error {
	var b strings.Builder
	b.WriteString("# Written by jetgres at every start: edits here are lost.\n")
	b.WriteString("# Change settings with ALTER SYSTEM, which is read after this file.\n")
	for _, k := range slices.Sorted(maps.Keys(settings)) {
		fmt.Fprintf(&b, "%s = %s\n", k, quoteConfValue(settings[k]))
	}
	path := filepath.Join(dataDir, confFileName)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", tmp, err)
	}
	if u.cred != nil {
		if err := os.Chown(tmp, int(u.uid), int(u.gid)); err != nil {
			return fmt.Errorf("giving %s to user %q: %w", tmp, u.name, err)
		}
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("replacing %s: %w", path, err)
	}
	return nil
}

// quoteConfValue quotes for postgresql.conf, where backslash is an escape inside quotes.
func quoteConfValue(v string) string {
	v = strings.ReplaceAll(v, `\`, `\\`)
	v = strings.ReplaceAll(v, `'`, `''`)
	return "'" + v + "'"
}

// commandLine renders settings as postgres -c arguments, in a stable order for the logs.
func commandLine(settings map[string]string) []string {
	var args []string
	for _, k := range slices.Sorted(maps.Keys(settings)) {
		args = append(args, "-c", k+"="+settings[k])
	}
	return args
}

// isOff recognises the usual spellings of false, so that a caller that turned fsync off for a
// throwaway cluster gets initdb --no-sync too.
func isOff(v string) bool {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "off", "false", "no", "0":
		return true
	}
	return false
}
