package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/pg"
)

// stream is one JetStream stream as this process serves it.
type stream struct {
	id      int64
	name    string
	created time.Time
	ackPfx  []byte

	// cfg is replaced whole, never changed in place: every publish and ack reads it, and
	// a copy of the struct per message cost more than the rest of the check.
	cfg   atomic.Pointer[server.StreamConfig]
	cfgMu sync.Mutex // guards subs
	subs  []*leaf.Subscription

	in  intake
	ret retained // interest and workqueue retention, see retention.go

	// chunkRows overrides pg.ChunkRowsDefault for this stream's new chunks when positive:
	// smaller chunks give space back sooner at the cost of more tables.
	chunkRows atomic.Int64
}

// config returns a copy of the stream's configuration, for callers that keep or change it.
func (s *stream) config() server.StreamConfig { return *s.cfg.Load() }

// cfgView returns the stream's configuration for reading only.
func (s *stream) cfgView() *server.StreamConfig { return s.cfg.Load() }

func (s *stream) setConfig(cfg server.StreamConfig) { s.cfg.Store(&cfg) }

func (s *stream) unsubscribe() {
	s.cfgMu.Lock()
	defer s.cfgMu.Unlock()
	s.unsubscribeLocked()
}

// unsubscribeLocked drops the stream's subject interest; cfgMu is held.
func (s *stream) unsubscribeLocked() {
	for _, sub := range s.subs {
		_ = sub.Unsubscribe()
	}
	s.subs = nil
}

// subscribe registers interest in the stream's subjects on the link, replacing any it had.
func (b *Bridge) subscribe(s *stream) error {
	s.cfgMu.Lock()
	defer s.cfgMu.Unlock()
	s.unsubscribeLocked()
	for _, subj := range s.cfgView().Subjects {
		sub, err := b.link.Subscribe(subj, "", func(m *leaf.Msg) { b.onPublish(s, m) })
		if err != nil {
			return fmt.Errorf("subscribe %q: %w", subj, err)
		}
		s.subs = append(s.subs, sub)
	}
	return nil
}

func (b *Bridge) lookup(name string) *stream {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return b.streams[name]
}

// lookupOrSync finds a stream, re-reading the list from PostgreSQL once if it is unknown
// here: another replica may have just created it.
func (b *Bridge) lookupOrSync(ctx context.Context, name string) *stream {
	if s := b.lookup(name); s != nil {
		return s
	}
	if err := b.syncStreams(ctx); err != nil {
		b.log.Warn("re-reading streams failed", "err", err)
	}
	return b.lookup(name)
}

func (b *Bridge) streamList() []*stream {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return slices.Collect(maps.Values(b.streams))
}

// syncStreams makes the served streams agree with PostgreSQL.
func (b *Bridge) syncStreams(ctx context.Context) error {
	b.adminMu.Lock()
	defer b.adminMu.Unlock()
	stored, err := b.db.Streams(ctx)
	if err != nil {
		return err
	}
	seen := make(map[string]bool, len(stored))
	for _, st := range stored {
		seen[st.Name] = true
		var cfg server.StreamConfig
		if err := json.Unmarshal(st.Config, &cfg); err != nil {
			b.log.Error("stored stream config does not decode", "stream", st.Name, "err", err)
			continue
		}
		cur := b.lookup(st.Name)
		switch {
		case cur == nil || cur.id != st.ID:
			if cur != nil {
				b.removeStream(cur)
			}
			if err := b.addStream(st, cfg); err != nil {
				return err
			}
		default:
			moved := !slices.Equal(cur.config().Subjects, cfg.Subjects)
			cur.setConfig(cfg)
			if moved {
				if err := b.subscribe(cur); err != nil {
					return err
				}
			}
		}
	}
	for _, s := range b.streamList() {
		if !seen[s.name] {
			b.removeStream(s)
		}
	}
	return nil
}

func (b *Bridge) addStream(st pg.Stream, cfg server.StreamConfig) error {
	s := &stream{id: st.ID, name: st.Name, created: st.Created, ackPfx: pubAckPrefix(st.Name)}
	s.setConfig(cfg)
	b.mu.Lock()
	b.streams[s.name] = s
	b.mu.Unlock()
	if err := b.subscribe(s); err != nil {
		return fmt.Errorf("stream %q: %w", s.name, err)
	}
	return nil
}

func (b *Bridge) removeStream(s *stream) {
	s.unsubscribe()
	b.mu.Lock()
	if b.streams[s.name] == s {
		delete(b.streams, s.name)
	}
	b.mu.Unlock()
	b.dropConsumers(s)
	b.closeIntake(s, server.NewJSStreamNotFoundError())
}

// maxStreamSubjects bounds the subjects of one stream. nats-server sets no limit, but
// jetgres checks every pair of a stream's subjects for overlap: without a bound, one
// request of a megabyte could keep an API worker busy for minutes.
const maxStreamSubjects = 1000

// checkStreamConfig validates a requested configuration and fills in JetStream's defaults
// for what the client left out, as nats-server does, so that the stored and reported config
// is complete. Features jetgres does not implement are refused rather than ignored. The
// batch-publishing permissions (allow_atomic, allow_batched) are kept because tools such as
// `nats bench --create` always set them; a publish that actually uses a batch is refused.
func checkStreamConfig(req server.StreamConfig, maxPayload int32) (server.StreamConfig, *server.ApiError) {
	cfg := req
	if !validName(cfg.Name) {
		return cfg, server.NewJSStreamInvalidConfigError(errors.New("stream name is required and can not contain '.', '*', '>', '\\', '/'"))
	}
	if len(cfg.Name) > server.JSMaxNameLen {
		return cfg, server.NewJSStreamInvalidConfigError(fmt.Errorf("stream name is too long, maximum allowed is %d", server.JSMaxNameLen))
	}
	if len(cfg.Description) > server.JSMaxDescriptionLen {
		return cfg, server.NewJSStreamInvalidConfigError(fmt.Errorf("stream description is too long, maximum allowed is %d", server.JSMaxDescriptionLen))
	}
	switch {
	case cfg.Mirror != nil || len(cfg.Sources) > 0:
		return cfg, server.NewJSStreamInvalidConfigError(errors.New("mirrors and sources are not supported by jetgres"))
	case cfg.SubjectTransform != nil || cfg.RePublish != nil:
		return cfg, server.NewJSStreamInvalidConfigError(errors.New("subject transforms and republish are not supported by jetgres"))
	case cfg.AllowMsgCounter || cfg.AllowMsgSchedules || cfg.AllowMsgTTL:
		return cfg, server.NewJSStreamInvalidConfigError(errors.New("counters, schedules and message TTLs are not supported by jetgres"))
	}
	if cfg.Retention > server.WorkQueuePolicy || cfg.Retention < server.LimitsPolicy {
		return cfg, server.NewJSStreamInvalidConfigError(errors.New("invalid retention"))
	}
	if cfg.Discard != server.DiscardOld && cfg.Discard != server.DiscardNew {
		return cfg, server.NewJSStreamInvalidConfigError(errors.New("invalid discard policy"))
	}
	if cfg.Storage == 0 {
		cfg.Storage = server.FileStorage
	}
	if cfg.Replicas == 0 {
		cfg.Replicas = 1
	}
	if cfg.Replicas < 0 {
		return cfg, server.NewJSReplicasCountCannotBeNegativeError()
	}
	if cfg.Replicas > server.StreamMaxReplicas {
		return cfg, server.NewJSStreamInvalidConfigError(fmt.Errorf("maximum replicas is %d", server.StreamMaxReplicas))
	}
	if cfg.MaxMsgs == 0 || cfg.MaxMsgs < -1 {
		cfg.MaxMsgs = -1
	}
	if cfg.MaxMsgsPer == 0 || cfg.MaxMsgsPer < -1 {
		cfg.MaxMsgsPer = -1
	}
	if cfg.MaxBytes == 0 || cfg.MaxBytes < -1 {
		cfg.MaxBytes = -1
	}
	if cfg.MaxMsgSize == 0 || cfg.MaxMsgSize < -1 {
		cfg.MaxMsgSize = -1
	}
	if cfg.MaxConsumers == 0 || cfg.MaxConsumers < -1 {
		cfg.MaxConsumers = -1
	}
	if cfg.MaxAge < 0 {
		return cfg, server.NewJSStreamInvalidConfigError(errors.New("max age can not be negative"))
	}
	if cfg.MaxAge != 0 && cfg.MaxAge < 100*time.Millisecond {
		return cfg, server.NewJSStreamInvalidConfigError(errors.New("max age needs to be >= 100ms"))
	}
	if cfg.Duplicates == 0 {
		cfg.Duplicates = server.StreamDefaultDuplicatesWindow
		if cfg.MaxAge != 0 && cfg.MaxAge < cfg.Duplicates {
			cfg.Duplicates = cfg.MaxAge
		}
	}
	if cfg.Duplicates < 0 {
		return cfg, server.NewJSStreamInvalidConfigError(errors.New("duplicates window can not be negative"))
	}
	if cfg.MaxAge != 0 && cfg.Duplicates > cfg.MaxAge {
		return cfg, server.NewJSStreamInvalidConfigError(errors.New("duplicates window can not be larger then max age"))
	}
	if cfg.Duplicates < 100*time.Millisecond {
		return cfg, server.NewJSStreamInvalidConfigError(errors.New("duplicates window needs to be >= 100ms"))
	}
	if cfg.DenyPurge && cfg.AllowRollup {
		return cfg, server.NewJSStreamInvalidConfigError(errors.New("roll-ups require the purge permission"))
	}
	if cfg.DiscardNewPer && (cfg.Discard != server.DiscardNew || cfg.MaxMsgsPer <= 0) {
		return cfg, server.NewJSStreamInvalidConfigError(errors.New("discard new per subject requires discard new policy and max msgs per subject > 0"))
	}
	if cfg.MaxMsgSize > maxPayload {
		return cfg, server.NewJSStreamInvalidConfigError(fmt.Errorf("max_msg_size can not exceed the server's max payload of %d", maxPayload))
	}
	if len(cfg.Subjects) == 0 {
		cfg.Subjects = []string{cfg.Name}
	}
	if len(cfg.Subjects) > maxStreamSubjects {
		return cfg, server.NewJSStreamInvalidConfigError(fmt.Errorf("a stream may have at most %d subjects", maxStreamSubjects))
	}
	seen := make(map[string]bool, len(cfg.Subjects))
	for i, subj := range cfg.Subjects {
		if !server.IsValidSubject(subj) {
			return cfg, server.NewJSStreamInvalidConfigError(errors.New("invalid subject"))
		}
		if seen[subj] {
			return cfg, server.NewJSStreamInvalidConfigError(errors.New("duplicate subjects detected"))
		}
		seen[subj] = true
		if subj == ">" {
			return cfg, server.NewJSStreamInvalidConfigError(errors.New("capturing all subjects is not supported by jetgres"))
		}
		for _, ns := range []string{"$JS.>", "$JSC.>", "$NRG.>", "$SYS.>", "_INBOX.>"} {
			if server.SubjectsCollide(subj, ns) {
				return cfg, server.NewJSStreamInvalidConfigError(fmt.Errorf("subjects that overlap with %s are not allowed", strings.TrimSuffix(ns, ".>")))
			}
		}
		for _, other := range cfg.Subjects[i+1:] {
			if server.SubjectsCollide(other, subj) {
				return cfg, server.NewJSStreamInvalidConfigError(fmt.Errorf("subject %q overlaps with %q", subj, other))
			}
		}
	}
	if e := checkConfigText(cfg); e != nil {
		return cfg, e
	}
	return cfg, nil
}

// checkConfigText refuses a configuration with a NUL character in any string: JSON carries
// it as \u0000, which PostgreSQL's jsonb refuses to store.
func checkConfigText(cfg any) *server.ApiError {
	raw, err := json.Marshal(cfg)
	if err != nil {
		return server.NewJSStreamInvalidConfigError(err)
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return server.NewJSStreamInvalidConfigError(err)
	}
	if hasNUL(v) {
		return server.NewJSStreamInvalidConfigError(errors.New("configuration contains a NUL character"))
	}
	return nil
}

// hasNUL reports whether a decoded JSON value has a NUL in any string or object key.
func hasNUL(v any) bool {
	switch v := v.(type) {
	case string:
		return strings.IndexByte(v, 0) >= 0
	case []any:
		return slices.ContainsFunc(v, hasNUL)
	case map[string]any:
		for k, e := range v {
			if strings.IndexByte(k, 0) >= 0 || hasNUL(e) {
				return true
			}
		}
	}
	return false
}

// validName is JetStream's rule for stream and consumer names: printable, no whitespace,
// and none of the characters that would make it a subject wildcard or a path. It must also
// be valid UTF-8, which JetStream does not ask but PostgreSQL text does: a name from a
// subject token can be any bytes.
func validName(name string) bool {
	if name == "" || !utf8.ValidString(name) {
		return false
	}
	for _, r := range name {
		switch {
		case r == '.' || r == '*' || r == '>' || r == '\\' || r == '/':
			return false
		case r <= ' ' || r == 0x7f:
			return false
		}
	}
	return true
}

// overlapping reports the first stream other than name whose subjects collide with subjects.
func (b *Bridge) overlapping(name string, subjects []string) *stream {
	for _, s := range b.streamList() {
		if s.name == name {
			continue
		}
		for _, a := range s.config().Subjects {
			for _, c := range subjects {
				if server.SubjectsCollide(a, c) {
					return s
				}
			}
		}
	}
	return nil
}
