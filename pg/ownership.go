package pg

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"

	"github.com/jetgres/jetgres/internal/clock"
)

// Ownership is a replica's claim on the consumers it serves: a session-level advisory lock
// per consumer, held on one dedicated connection, is the one thing that says which replica
// serves a consumer. PostgreSQL releases a session's advisory locks the moment the session
// ends, so the consumers of a replica that died are free for another at once. The owner
// column only records the holder, for info, for forwarding requests to it, and for the
// cursor write's check that no other replica took the consumer over meanwhile.
//
// A consumer's lock key is its id (jetgres.consumers.id) in the two-key space, split into
// its high and low 31 bits, apart from the one-key locks of migrations, stream
// administration and replicaLockKey. Ids are unique, so no two consumers share a lock.
type Ownership struct {
	db        *DB
	clock     clock.Clock
	keepalive time.Duration
	timeout   time.Duration // of every statement on conn

	mu   sync.Mutex // one statement at a time on conn
	conn *pgx.Conn  // nil once broken or closed
	// pid and started name the session conn is, so that a new one can end an old one that
	// PostgreSQL has not noticed is gone (its locks would stay held).
	pid     uint32
	started time.Time
	// server names the server the session is on (see serverSQL): once the pool has left it
	// for another, the session's locks guard nothing.
	server string
	held   map[int64]heldLock // what this session locked, by consumer id
	// schedulers are the streams whose scheduler lock this session holds (HoldScheduler).
	schedulers map[int64]bool
	// plain is a session that does not count as a live replica (OpenCopyLocks).
	plain bool
	// confirmed is when (unix ns, on clock) the last statement that succeeded on conn was
	// sent: the session held its locks then. Zero while there is no connection. Atomic, so
	// that a watchdog reads it while a statement holds mu.
	confirmed atomic.Int64
}

// heldLock is one consumer's lock as this session holds it: whose it is, and how many
// times it was taken. Two consumers of one name may be held at once, a deleted one still
// stopping and its successor: each gives back its own lock, by id.
type heldLock struct {
	k ConsumerKey
	n int
}

// replicaLockKey is the one-key advisory lock every ownership session holds shared, so that
// the live replicas can be counted in pg_locks: a dead replica's drops out with its session.
// It is "jgreplic", away from the numbered keys of migrateLockKey and streamAdminLockKey.
const replicaLockKey int64 = 0x6a677265706c6963

const (
	// sqlLockKey is a consumer's lock key from its id, $1.
	sqlLockKey = `(($1::bigint >> 31)::int4, ($1::bigint & 2147483647)::int4)`
	// sqlTryLockRow locks a consumer by its row, unless this session holds it already ($3).
	// A consumer read in SQL (jetgres.sql_consumers) is left to the transactions that read it.
	sqlTryLockRow = `SELECT id, id = ANY($3) OR (NOT in_sql AND pg_try_advisory_lock((id >> 31)::int4, (id & 2147483647)::int4)), in_sql
		FROM (SELECT id, EXISTS (SELECT 1 FROM jetgres.sql_consumers q WHERE q.consumer_id = c.id) AS in_sql
			FROM jetgres.consumers c WHERE stream_id = $1 AND name = $2) c`
	sqlLockNew = `SELECT id, pg_try_advisory_lock((id >> 31)::int4, (id & 2147483647)::int4) FROM (SELECT nextval(pg_get_serial_sequence('jetgres.consumers', 'id')) AS id) n`
	sqlUnlock  = `SELECT pg_advisory_unlock` + sqlLockKey
	// sqlStored counts a consumer switched to SQL as gone: its replica lets it go.
	sqlStored = `SELECT id FROM jetgres.consumers c WHERE id = ANY($1)
		AND NOT EXISTS (SELECT 1 FROM jetgres.sql_consumers q WHERE q.consumer_id = c.id)`
	sqlSessionStart = `SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()`
	sqlEndSession   = `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = $1 AND backend_start = $2`
	// sqlReplica takes the shared lock every ownership session holds while it lives:
	// counting its holders counts the live replicas.
	sqlReplica = `SELECT pg_advisory_lock_shared($1)`
	// sqlClaimFree locks, in one statement, this replica's share of the consumers of the
	// given streams whose lock no session holds: as many as bring it to its fair share of
	// them all among the live replicas ($3 is how many it holds), and at least one when $6
	// says free consumers have been left too long, so that one the others leave (a replica
	// that is alive but does not look, say) is still taken. The ones this session holds
	// already ($2) are left out (a second lock would only count up); so are those pg_locks
	// shows another session holding. The candidates are numbered at random and materialised
	// first, so that the lock is tried on no more than the share and two replicas looking at
	// once mostly try different ones; every free candidate is returned, taken or not, so
	// that the caller knows what it left.
	sqlClaimFree = `WITH here AS (SELECT oid FROM pg_database WHERE datname = current_database()),
		locked AS MATERIALIZED (
			SELECT (l.classid::bigint << 31) | l.objid::bigint AS id FROM pg_locks l, here
			WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted AND l.database = here.oid
				AND l.pid <> pg_backend_pid()),
		live AS (
			SELECT greatest(count(*), 1) AS n FROM pg_locks l, here
			WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted AND l.database = here.oid
				AND l.classid::bigint = $4 AND l.objid::bigint = $5),
		total AS (SELECT count(*) AS n FROM jetgres.consumers WHERE stream_id = ANY($1)),
		share AS (SELECT greatest(ceil(total.n::numeric / live.n)::bigint - $3, CASE WHEN $6 THEN 1 ELSE 0 END) AS n
			FROM total, live),
		cand AS MATERIALIZED (
			SELECT id, stream_id, name, row_number() OVER (ORDER BY random()) AS rn FROM jetgres.consumers c
			WHERE stream_id = ANY($1) AND NOT (id = ANY($2))
				AND NOT EXISTS (SELECT 1 FROM locked WHERE locked.id = c.id)
				AND NOT EXISTS (SELECT 1 FROM jetgres.sql_consumers q WHERE q.consumer_id = c.id))
		SELECT id, stream_id, name,
			CASE WHEN rn <= share.n THEN pg_try_advisory_lock((id >> 31)::int4, (id & 2147483647)::int4) ELSE false END
		FROM cand, share`
)

// OpenOwnership opens the dedicated connection. clk stamps the confirmations that Confirmed
// reports, so that a caller measuring their age on its own clock compares like with like;
// nil means the system clock. keepalive is how long PostgreSQL waits on a silent connection
// before probing it (then three probes a second apart), and bounds an unacknowledged answer
// as long (keepaliveParams): a replica cut off from the database has stopped delivering long
// before PostgreSQL gives its locks away. timeout bounds every
// statement on the connection; one that runs past it breaks the connection, so that the
// caller learns at once that it can vouch for nothing. Both are in real time, whatever clk
// is: they bound what PostgreSQL and the network do.
func (db *DB) OpenOwnership(ctx context.Context, clk clock.Clock, keepalive, timeout time.Duration) (*Ownership, error) {
	o := &Ownership{db: db, clock: clock.OrSystem(clk), keepalive: keepalive, timeout: timeout, held: make(map[int64]heldLock)}
	if err := o.Reconnect(ctx); err != nil {
		return nil, err
	}
	return o, nil
}

// Reconnect replaces a broken connection by a new session holding no locks, and ends the old
// session if PostgreSQL still runs it. Without a broken connection it does nothing.
func (o *Ownership) Reconnect(ctx context.Context) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.conn != nil {
		return nil
	}
	cfg := o.db.pool.Config().ConnConfig.Copy()
	maps.Copy(cfg.RuntimeParams, keepaliveParams(o.keepalive))
	cfg.RuntimeParams["application_name"] = cfg.RuntimeParams["application_name"] + " ownership"
	// A statement that runs out of time ends at its deadline, as pgx's own handler ends it:
	// the pool's handler first asks the server to cancel it, which through a network that
	// dropped the connection takes seconds more, and the caller must learn within its
	// timeout that it can vouch for nothing. The session is broken then anyway.
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
	}
	// Bounded by the lease rather than the statement timeout: the session is useless to a
	// replica that cannot get it within a lease, and other calls wait for it meanwhile.
	ctx, cancel := context.WithTimeout(ctx, min(o.db.cfg.StmtTimeout, o.keepalive))
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("pg: ownership connection: %w", err)
	}
	var started time.Time
	if err := conn.QueryRow(ctx, sqlSessionStart).Scan(&started); err != nil {
		_ = conn.Close(context.Background())
		return fmt.Errorf("pg: ownership connection: %w", err)
	}
	var server string
	if err := conn.QueryRow(ctx, serverSQL).Scan(&server); err != nil {
		_ = conn.Close(context.Background())
		return fmt.Errorf("pg: ownership connection: %w", err)
	}
	if !o.plain {
		if _, err := conn.Exec(ctx, sqlReplica, replicaLockKey); err != nil {
			_ = conn.Close(context.Background())
			return fmt.Errorf("pg: ownership connection: %w", err)
		}
	}
	if o.pid != 0 {
		if _, err := conn.Exec(ctx, sqlEndSession, o.pid, o.started); err != nil {
			o.db.log.Warn("ending the previous ownership session failed", "pid", o.pid, "err", err)
		}
	}
	o.conn, o.pid, o.started, o.server = conn, conn.PgConn().PID(), started, server
	o.confirmed.Store(o.clock.Now().UnixNano())
	clear(o.held)
	clear(o.schedulers)
	return nil
}

// Connected reports whether the connection is up as far as this process knows.
func (o *Ownership) Connected() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.conn != nil
}

// Confirmed is when, on the clock given to OpenOwnership, the last statement that succeeded
// on the connection was sent, the zero time while there is none: every lock this process
// holds was held then.
func (o *Ownership) Confirmed() time.Time {
	ns := o.confirmed.Load()
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// exec runs fn on the connection within the statement timeout. Any failure breaks the
// connection: its session's locks can no longer be vouched for.
func (o *Ownership) exec(ctx context.Context, fn func(ctx context.Context, c *pgx.Conn) error) error {
	if o.conn == nil {
		return ErrOwnershipLost
	}
	if o.db.server.abandoned(o.server) {
		// The pool found another server (a standby promoted) while this session stayed on
		// the old one, read-only but alive: the locks it holds there guard nothing.
		o.breakLocked()
		return fmt.Errorf("%w: the session is on %s, the database on another server", ErrOwnershipLost, o.server)
	}
	sent := o.clock.Now()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	err := fn(ctx, o.conn)
	if err != nil && !errors.Is(err, errNoRow) {
		o.breakLocked()
		return fmt.Errorf("%w: %w", ErrOwnershipLost, err)
	}
	o.confirmed.Store(sent.UnixNano())
	return err
}

func (o *Ownership) breakLocked() {
	if o.conn != nil {
		c := o.conn
		o.conn = nil
		go func() { _ = c.Close(context.Background()) }()
	}
	o.confirmed.Store(0)
	clear(o.held)
	clear(o.schedulers)
}

// ErrOwnershipLost says the ownership connection failed: every lock it held must be taken as
// gone, and the consumers it vouched for must stop.
var ErrOwnershipLost = errors.New("pg: ownership connection lost")

// Confirm checks that the session holding the locks is alive, and measures on the way how
// far the replica's clock is from PostgreSQL's (DB.ClockOffset).
func (o *Ownership) Confirm(ctx context.Context) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.exec(ctx, func(ctx context.Context, c *pgx.Conn) error { return o.db.readClock(ctx, c, o.clock) })
}

// TryLock takes the lock of a stored consumer unless another session holds it, and returns
// its id, which Unlock takes; ErrNotFound says there is no such consumer, ErrReadInSQL that
// it is read in SQL.
func (o *Ownership) TryLock(ctx context.Context, k ConsumerKey) (int64, bool, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var id int64
	var ok, inSQL bool
	err := o.exec(ctx, func(ctx context.Context, c *pgx.Conn) error {
		err := c.QueryRow(ctx, sqlTryLockRow, k.StreamID, k.Name, o.heldIDs()).Scan(&id, &ok, &inSQL)
		if errors.Is(err, pgx.ErrNoRows) {
			return errNoRow
		}
		return err
	})
	switch {
	case errors.Is(err, errNoRow):
		return 0, false, ErrNotFound
	case err == nil && !ok && inSQL:
		return id, false, ErrReadInSQL
	case err != nil || !ok:
		return id, false, err
	}
	h := o.held[id]
	h.k, h.n = k, h.n+1
	o.held[id] = h
	return id, true, nil
}

// heldIDs lists the ids of the consumers this session holds; mu is held.
func (o *Ownership) heldIDs() []int64 {
	ids := make([]int64, 0, len(o.held))
	for id := range o.held {
		ids = append(ids, id)
	}
	return ids
}

// errNoRow is a statement on the session that found nothing, which says nothing about the
// session: exec must not break it.
var errNoRow = errors.New("pg: no row")

// LockNew takes a fresh consumer id and its lock, for a consumer about to be created under
// k: no other replica can take it over between its creation and its serving here. The id
// goes into CreateConsumer; if the create fails, Unlock gives the lock back.
func (o *Ownership) LockNew(ctx context.Context, k ConsumerKey) (int64, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var id int64
	var ok bool
	err := o.exec(ctx, func(ctx context.Context, c *pgx.Conn) error {
		return c.QueryRow(ctx, sqlLockNew).Scan(&id, &ok)
	})
	if err != nil {
		return 0, err
	}
	if !ok {
		// A fresh id from the sequence that some session holds: only a lock taken by hand.
		return 0, fmt.Errorf("pg: the lock of new consumer id %d is held", id)
	}
	o.held[id] = heldLock{k: k, n: 1}
	return id, nil
}

// Unlock gives one TryLock, LockNew or ClaimFree of the consumer with that id back; the
// last one frees it for other replicas.
func (o *Ownership) Unlock(ctx context.Context, id int64) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	h, ok := o.held[id]
	switch {
	case !ok:
		return nil
	case h.n > 1:
		h.n--
		o.held[id] = h
		return nil
	}
	delete(o.held, id)
	return o.unlockLocked(ctx, id)
}

func (o *Ownership) unlockLocked(ctx context.Context, id int64) error {
	return o.exec(ctx, func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, sqlUnlock, id)
		return err
	})
}

// Claim is a consumer whose lock this session took: its key and its id, which Unlock takes.
type Claim struct {
	ConsumerKey
	ID int64
}

// ClaimFree locks this replica's fair share of the consumers of the given streams that no
// session holds, and at least one when overdue says free consumers have been left too long,
// and returns those it took and how many free ones it left.
func (o *Ownership) ClaimFree(ctx context.Context, streamIDs []int64, overdue bool) ([]Claim, int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	mine := o.heldIDs()
	var got []Claim
	left := 0
	err := o.exec(ctx, func(ctx context.Context, c *pgx.Conn) error {
		rows, err := c.Query(ctx, sqlClaimFree, streamIDs, mine, len(mine), replicaLockKey>>32, replicaLockKey&0xffffffff, overdue)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var cl Claim
			var taken bool
			if err := rows.Scan(&cl.ID, &cl.StreamID, &cl.Name, &taken); err != nil {
				return err
			}
			if taken {
				got = append(got, cl)
			} else {
				left++
			}
		}
		return rows.Err()
	})
	for _, cl := range got {
		o.held[cl.ID] = heldLock{k: cl.ConsumerKey, n: 1}
	}
	return got, left, err
}

// Deleted returns the consumers this session holds the lock of whose rows are gone:
// deleted, by this replica or another, they must stop being served. A statement on the
// session, it confirms the session as Confirm does.
func (o *Ownership) Deleted(ctx context.Context) ([]Claim, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var stored []int64
	err := o.exec(ctx, func(ctx context.Context, c *pgx.Conn) error {
		rows, err := c.Query(ctx, sqlStored, o.heldIDs())
		if err != nil {
			return err
		}
		stored, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		return err
	})
	if err != nil {
		return nil, err
	}
	there := make(map[int64]bool, len(stored))
	for _, id := range stored {
		there[id] = true
	}
	var gone []Claim
	for id, h := range o.held {
		if !there[id] {
			gone = append(gone, Claim{ConsumerKey: h.k, ID: id})
		}
	}
	return gone, nil
}

// Close ends the session, which frees every lock it held.
func (o *Ownership) Close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.conn != nil {
		_ = o.conn.Close(context.Background())
		o.conn = nil
	}
	o.confirmed.Store(0)
	clear(o.held)
	clear(o.schedulers)
}

// SetOwner records owner as the server of the consumer with that id, whose lock owner's
// session holds, and returns it as stored with the owner it had before. ErrNotFound says it
// does not exist (any more: one created again under its name has another id).
func (db *DB) SetOwner(ctx context.Context, id int64, owner string) (Consumer, string, error) {
	var c Consumer
	var prev string
	err := db.background(ctx, func(ctx context.Context, q querier) error {
		var as, ac, ss int64
		err := q.QueryRow(ctx, `WITH prev AS (SELECT owner FROM jetgres.consumers WHERE id = $1 FOR UPDATE)
			UPDATE jetgres.consumers c SET owner = $2 FROM prev
			WHERE c.id = $1
			RETURNING c.id, c.stream_id, c.name, c.config, c.created, c.ack_stream_seq, c.ack_consumer_seq, c.owner,
				coalesce(c.shown_stream_seq, c.ack_stream_seq), prev.owner`,
			id, owner).Scan(&c.ID, &c.StreamID, &c.Name, &c.Config, &c.Created, &as, &ac, &c.Owner, &ss, &prev)
		c.AckStreamSeq, c.AckConsumerSeq, c.ShownStreamSeq = uint64(as), uint64(ac), uint64(ss)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNotFound
		}
		return err
	})
	if err != nil && !errors.Is(err, ErrNotFound) {
		return Consumer{}, "", fmt.Errorf("pg: set consumer owner: %w", err)
	}
	return c, prev, err
}

// DeploymentSecret returns the secret the replicas of this database share and no NATS
// client knows, with which they seal the requests they forward to each other.
func (db *DB) DeploymentSecret(ctx context.Context) ([]byte, error) {
	var secret []byte
	err := db.background(ctx, func(ctx context.Context, q querier) error {
		return q.QueryRow(ctx, `SELECT secret FROM jetgres.deployment`).Scan(&secret)
	})
	if err != nil {
		return nil, fmt.Errorf("pg: deployment secret: %w", err)
	}
	return secret, nil
}

// ClockOffset is DB.ClockOffset, which the session's confirmations measure.
func (o *Ownership) ClockOffset() (time.Duration, bool) { return o.db.ClockOffset() }
