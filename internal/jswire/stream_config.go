package jswire

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats-server/v2/server"
)

// MaxStreamSubjects bounds the subjects of one stream. nats-server sets no limit, but
// jetgres checks every pair of a stream's subjects for overlap: without a bound, one
// request of a megabyte could keep an API worker busy for minutes.
const MaxStreamSubjects = 1000

// CheckStreamConfig validates a requested configuration and fills in JetStream's defaults
// for what the client left out, as nats-server does, so that the stored and reported config
// is complete. Features jetgres does not implement are refused rather than ignored.
// A mirror or sources are checked as nats-server checks them on their own (checkCopies);
// what needs the other streams (direct gets inherited from a mirror's origin, cycles) is
// the caller's.
// allow_atomic (atomic batch publish), allow_msg_counter, allow_msg_schedules,
// allow_msg_ttl and subject_delete_marker_ttl are served; allow_batched, fast batch publish, is kept
// because tools such as `nats bench --create` always set it, and a publish that uses a fast
// batch is refused.
func CheckStreamConfig(req server.StreamConfig, maxPayload int32) (server.StreamConfig, *server.ApiError) {
	cfg := req
	if !ValidName(cfg.Name) {
		return cfg, server.NewJSStreamInvalidConfigError(errors.New("stream name is required and can not contain '.', '*', '>', '\\', '/'"))
	}
	if len(cfg.Name) > server.JSMaxNameLen {
		return cfg, server.NewJSStreamInvalidConfigError(fmt.Errorf("stream name is too long, maximum allowed is %d", server.JSMaxNameLen))
	}
	if len(cfg.Description) > server.JSMaxDescriptionLen {
		return cfg, server.NewJSStreamInvalidConfigError(fmt.Errorf("stream description is too long, maximum allowed is %d", server.JSMaxDescriptionLen))
	}
	if cfg.PersistMode == server.AsyncPersistMode {
		switch {
		case cfg.Storage == server.MemoryStorage:
			return cfg, server.NewJSStreamInvalidConfigError(errors.New("async persist mode is only supported on file storage"))
		case cfg.Replicas > 1:
			return cfg, server.NewJSStreamInvalidConfigError(errors.New("async persist mode is not supported on replicated streams"))
		case cfg.AllowAtomicPublish:
			return cfg, server.NewJSStreamInvalidConfigError(errors.New("async persist mode is not supported with atomic batch publish"))
		}
	}
	if e := CheckSeq("first_seq", cfg.FirstSeq); e != nil {
		return cfg, e
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
	// A mirror or a stream with sources keeps no duplicate window unless asked to.
	if cfg.Duplicates == 0 && cfg.Mirror == nil && len(cfg.Sources) == 0 {
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
	if cfg.Duplicates > 0 && cfg.Duplicates < 100*time.Millisecond {
		return cfg, server.NewJSStreamInvalidConfigError(errors.New("duplicates window needs to be >= 100ms"))
	}
	if cfg.DenyPurge && cfg.AllowRollup {
		return cfg, server.NewJSStreamInvalidConfigError(errors.New("roll-ups require the purge permission"))
	}
	if e := checkCounterConfig(cfg); e != nil {
		return cfg, e
	}
	if cfg.DiscardNewPer && (cfg.Discard != server.DiscardNew || cfg.MaxMsgsPer <= 0) {
		return cfg, server.NewJSStreamInvalidConfigError(errors.New("discard new per subject requires discard new policy and max msgs per subject > 0"))
	}
	if e := checkMarkerTTL(&cfg); e != nil {
		return cfg, e
	}
	if e := checkScheduleConfig(&cfg); e != nil {
		return cfg, e
	}
	if cfg.MaxMsgSize > maxPayload {
		return cfg, server.NewJSStreamInvalidConfigError(fmt.Errorf("max_msg_size can not exceed the server's max payload of %d", maxPayload))
	}
	if e := checkCopies(&cfg); e != nil {
		return cfg, e
	}
	if len(cfg.Subjects) == 0 && cfg.Mirror == nil && len(cfg.Sources) == 0 {
		cfg.Subjects = []string{cfg.Name}
	}
	if len(cfg.Subjects) > MaxStreamSubjects {
		return cfg, server.NewJSStreamInvalidConfigError(fmt.Errorf("a stream may have at most %d subjects", MaxStreamSubjects))
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
	if e := checkTransforms(&cfg); e != nil {
		return cfg, e
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

// ValidName is JetStream's rule for stream and consumer names: printable, no whitespace,
// and none of the characters that would make it a subject wildcard or a path. It must also
// be valid UTF-8, which JetStream does not ask but PostgreSQL text does: a name from a
// subject token can be any bytes.
func ValidName(name string) bool {
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

// SameStreamConfig reports whether two stream configurations are the same, as a repeated
// create compares them.
func SameStreamConfig(a, b server.StreamConfig) bool {
	a.Metadata, b.Metadata = userMetadata(a.Metadata), userMetadata(b.Metadata)
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}
