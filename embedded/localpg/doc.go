// Package localpg runs a private PostgreSQL cluster for jetgres from the PostgreSQL server
// binaries installed on the machine, so that a user without a database server can still run
// jetgres with one command.
//
// The cluster is private by construction rather than by password:
//
//   - The server listens on a Unix socket only (listen_addresses is empty), and that socket lives
//     in the data directory, which initdb makes mode 0700 and which belongs to the OS user the
//     server runs as. Only that user and root can reach the socket.
//   - Because nobody else can connect, the cluster uses trust authentication (initdb --auth=trust)
//     and jetgres needs no password to manage. Peer authentication would add nothing but an ident
//     map, since jetgres connects as root while the server runs as an unprivileged user.
//   - The superuser is named "jetgres" and the database jetgres uses is "jetgres".
//
// Start initialises the cluster on first use (UTF8, C locale, data checksums), starts the
// postgres binary directly as a child process in its own process group (so a Ctrl-C on the
// terminal reaches jetgres, which then stops PostgreSQL in order), and returns once the server
// accepts connections. When jetgres runs as root the server runs as an unprivileged user,
// "postgres" if that user exists, otherwise "nobody".
//
// A lock file beside the data directory (<DataDir>.lock, held with flock while the Cluster runs)
// tells a live owner from a dead one: if jetgres was killed and PostgreSQL survived it, the next
// Start finds the lock free and the old server still running, stops that orphan with a fast
// shutdown and starts a fresh server. If another live process holds the lock, Start fails with
// ErrInUse instead of touching its server.
//
// With Config.Restart the Cluster supervises its server, which is its child: when the server
// dies (the OOM killer, a kill -9 of the postmaster), the supervisor knows at once, kills the
// dead server's surviving children (a new postmaster must not start while they hold the old
// shared memory), removes the stale pid file and starts the server again, which runs crash
// recovery; a failed start is retried with exponential backoff. Up is false meanwhile. Done
// is closed only when the server cannot come back: its data directory is gone, or
// Config.MaxFailedStarts starts in a row failed. A start that failed on a full disk (the
// server stops when it cannot write its WAL, and its crash recovery cannot write either) does
// not count: it is retried every couple of seconds for as long as the disk stays full, and
// DiskFull says so meanwhile, so that the server is back soon after space is freed.
//
// The server's log is not written to a file: its stderr is streamed to the Config.Logger, one
// record per line (LOG, ERROR and the like at debug level, WARNING and FATAL at warn, PANIC at
// error; the FATAL with which the fast shutdown that Stop begins ends each session is at debug),
// so that it lands wherever jetgres's own log goes and needs no rotation.
//
// Settings: jetgres writes its defaults and Config.Settings to jetgres.conf in the data directory
// at every start; postgresql.conf includes that file, and postgresql.auto.conf (ALTER SYSTEM) is
// read after it, so an operator can still tune the server with ALTER SYSTEM. The settings that
// keep the cluster private (listen_addresses, unix_socket_directories, unix_socket_permissions,
// port) and those jetgres needs to read the log (logging_collector, log_destination,
// log_line_prefix) are passed on the command line and cannot be overridden.
//
// The package is for Unix systems; it relies on flock, process groups and, on Linux, /proc to
// recognise an orphaned server.
package localpg
