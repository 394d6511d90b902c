package jswire

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Consumer defaults nats-server applies and reports back; jetgres does the same so that a
// client sees the configuration it would see against JetStream.
const (
	consumerAckWaitDefault       = 30 * time.Second
	consumerMaxAckPendingDefault = 1000
	consumerMaxWaitingDefault    = 512
	ephemeralInactiveDefault     = 5 * time.Second
)

// CheckConsumerConfig fills in JetStream's defaults and validates a requested pull
// consumer configuration against its stream, returning the JetStream error a client
// expects. Features jetgres does not serve are refused rather than ignored.
func CheckConsumerConfig(req server.ConsumerConfig, scfg *server.StreamConfig) (server.ConsumerConfig, *server.ApiError) {
	cfg := req
	if cfg.DeliverSubject == "" && (cfg.DeliverGroup != "" || cfg.FlowControl) {
		return cfg, server.NewJSConsumerCreateError(errors.New("deliver_group and flow_control need a deliver_subject"))
	}
	if cfg.Direct || cfg.Sourcing {
		return cfg, server.NewJSConsumerCreateError(errors.New("direct and sourcing consumers are not supported by jetgres"))
	}
	if cfg.PriorityPolicy != server.PriorityNone || len(cfg.PriorityGroups) > 0 || cfg.PinnedTTL > 0 {
		return cfg, server.NewJSConsumerCreateError(errors.New("priority groups are not supported by jetgres"))
	}
	if cfg.PauseUntil != nil {
		utc := cfg.PauseUntil.UTC()
		cfg.PauseUntil = &utc
	}
	if cfg.ReplayPolicy == server.ReplayOriginal {
		return cfg, server.NewJSConsumerCreateError(errors.New("replay original is not supported by jetgres"))
	}
	if cfg.AckPolicy == server.AckFlowControl {
		return cfg, server.NewJSConsumerAckFCRequiresPushError()
	}
	if cfg.RateLimit > 0 && cfg.DeliverSubject == "" {
		return cfg, server.NewJSConsumerPullWithRateLimitError()
	}

	// Empty lists are stored as nothing (their JSON is omitempty) and come back nil: make
	// them nil now, so that a configuration equals itself after a trip through PostgreSQL
	// and a repeated create of it is not taken for a different one.
	if len(cfg.BackOff) == 0 {
		cfg.BackOff = nil
	}
	if len(cfg.FilterSubjects) == 0 {
		cfg.FilterSubjects = nil
	}
	if len(cfg.PriorityGroups) == 0 {
		cfg.PriorityGroups = nil
	}

	// Defaults, in setConsumerConfigDefaults' order.
	if cfg.MaxDeliver == 0 || cfg.MaxDeliver < -1 {
		cfg.MaxDeliver = -1
	}
	cfg.MaxWaiting = max(cfg.MaxWaiting, 0)
	if cfg.MaxAckPending < -1 {
		cfg.MaxAckPending = -1
	}
	cfg.MaxRequestBatch = max(cfg.MaxRequestBatch, 0)
	cfg.MaxRequestExpires = max(cfg.MaxRequestExpires, 0)
	cfg.MaxRequestMaxBytes = max(cfg.MaxRequestMaxBytes, 0)
	cfg.InactiveThreshold = max(cfg.InactiveThreshold, 0)
	if cfg.MaxWaiting == 0 && cfg.DeliverSubject == "" {
		cfg.MaxWaiting = consumerMaxWaitingDefault
	}
	if cfg.AckWait == 0 && (cfg.AckPolicy == server.AckExplicit || cfg.AckPolicy == server.AckAll) {
		cfg.AckWait = consumerAckWaitDefault
	}
	if len(cfg.BackOff) > 0 {
		cfg.AckWait = cfg.BackOff[0]
	}
	if cfg.MaxAckPending == 0 {
		cfg.MaxAckPending = scfg.ConsumerLimits.MaxAckPending
	}
	if cfg.InactiveThreshold == 0 {
		cfg.InactiveThreshold = scfg.ConsumerLimits.InactiveThreshold
	}
	if cfg.MaxAckPending == 0 && cfg.AckPolicy != server.AckNone {
		cfg.MaxAckPending = consumerMaxAckPendingDefault
	}
	if cfg.Durable == "" && cfg.InactiveThreshold == 0 {
		cfg.InactiveThreshold = ephemeralInactiveDefault
	}

	// Checks, in checkConsumerCfg's order where they apply to pull consumers.
	if cfg.Name != "" && !ValidName(cfg.Name) {
		return cfg, server.NewJSStreamInvalidConfigError(errors.New("consumer name can not contain '.', '*', '>', '\\', '/'"))
	}
	if cfg.Durable != "" && !ValidName(cfg.Durable) {
		return cfg, server.NewJSStreamInvalidConfigError(errors.New("consumer durable name can not contain '.', '*', '>', '\\', '/'"))
	}
	if len(cfg.Durable) > server.JSMaxNameLen || len(cfg.Name) > server.JSMaxNameLen {
		return cfg, server.NewJSConsumerNameTooLongError(server.JSMaxNameLen)
	}
	if cfg.Replicas < 0 {
		return cfg, server.NewJSReplicasCountCannotBeNegativeError()
	}
	if cfg.Replicas > max(scfg.Replicas, 1) {
		return cfg, server.NewJSConsumerReplicasExceedsStreamError()
	}
	if cfg.AckPolicy < server.AckNone || cfg.AckPolicy > server.AckExplicit {
		return cfg, server.NewJSConsumerAckPolicyInvalidError()
	}
	if cfg.ReplayPolicy != server.ReplayInstant {
		return cfg, server.NewJSConsumerReplayPolicyInvalidError()
	}
	for _, d := range cfg.BackOff {
		if d < 0 {
			return cfg, server.NewJSConsumerBackOffNegativeError()
		}
	}
	if cfg.AckWait < 0 {
		return cfg, server.NewJSConsumerAckWaitNegativeError()
	}
	if n := len(cfg.BackOff); n > 0 && cfg.MaxDeliver != -1 && n > cfg.MaxDeliver {
		return cfg, server.NewJSConsumerMaxDeliverBackoffError()
	}
	if len(cfg.Description) > server.JSMaxDescriptionLen {
		return cfg, server.NewJSConsumerDescriptionTooLongError(server.JSMaxDescriptionLen)
	}
	if cfg.AckPolicy == server.AckNone && scfg.Retention == server.WorkQueuePolicy {
		return cfg, server.NewJSConsumerPullRequiresAckError()
	}
	if cfg.MaxRequestExpires != 0 && cfg.MaxRequestExpires < time.Millisecond {
		return cfg, server.NewJSConsumerMaxRequestExpiresTooSmallError()
	}
	if lim := scfg.ConsumerLimits.MaxAckPending; lim > 0 && cfg.MaxAckPending > lim {
		return cfg, server.NewJSConsumerMaxPendingAckExcessError(lim)
	}
	if lim := scfg.ConsumerLimits.InactiveThreshold; lim > 0 && cfg.InactiveThreshold > lim {
		return cfg, server.NewJSConsumerInactiveThresholdExcessError(lim)
	}
	if cfg.FilterSubject != "" && len(cfg.FilterSubjects) > 0 {
		return cfg, server.NewJSConsumerDuplicateFilterSubjectsError()
	}
	if cfg.FilterSubject != "" && !server.IsValidSubject(cfg.FilterSubject) {
		return cfg, server.NewJSStreamInvalidConfigError(server.ErrBadSubject)
	}
	for _, f := range cfg.FilterSubjects {
		if f == "" {
			return cfg, server.NewJSConsumerEmptyFilterError()
		}
	}
	filters := ConsumerFilters(&cfg)
	for i, f := range filters {
		if !server.IsValidSubject(f) {
			return cfg, server.NewJSStreamInvalidConfigError(server.ErrBadSubject)
		}
		for j, g := range filters {
			if i != j && server.SubjectsCollide(f, g) && (server.SubjectMatchesFilter(f, g) || server.SubjectMatchesFilter(g, f)) {
				return cfg, server.NewJSConsumerOverlappingSubjectFiltersError()
			}
		}
	}
	if err := checkDeliverPolicy(&cfg); err != nil {
		return cfg, err
	}
	if cfg.Durable != "" && cfg.Name != "" && cfg.Name != cfg.Durable {
		return cfg, server.NewJSConsumerCreateDurableAndNameMismatchError()
	}
	n := 0
	for k, v := range cfg.Metadata {
		n += len(k) + len(v)
	}
	if n > server.JSMaxMetadataLen {
		return cfg, server.NewJSConsumerMetadataLengthError(fmt.Sprintf("%dKB", server.JSMaxMetadataLen/1024))
	}
	if scfg.Retention == server.WorkQueuePolicy {
		if cfg.AckPolicy != server.AckExplicit {
			return cfg, server.NewJSConsumerWQRequiresExplicitAckError()
		}
		if cfg.DeliverPolicy != server.DeliverAll {
			return cfg, server.NewJSConsumerWQConsumerNotDeliverAllError()
		}
	}
	if e := checkConfigText(cfg); e != nil {
		return cfg, e
	}
	return cfg, nil
}

func checkDeliverPolicy(cfg *server.ConsumerConfig) *server.ApiError {
	badStart := func(dp, start string) *server.ApiError {
		return server.NewJSConsumerInvalidPolicyError(fmt.Errorf("consumer delivery policy is deliver %s, but optional start %s is also set", dp, start))
	}
	notSet := func(dp, what string) *server.ApiError {
		return server.NewJSConsumerInvalidPolicyError(fmt.Errorf("consumer delivery policy is deliver %s, but optional %s is not set", dp, what))
	}
	switch cfg.DeliverPolicy {
	case server.DeliverAll, server.DeliverLast, server.DeliverNew, server.DeliverLastPerSubject:
		name := map[server.DeliverPolicy]string{server.DeliverAll: "all", server.DeliverLast: "last",
			server.DeliverNew: "new", server.DeliverLastPerSubject: "last per subject"}[cfg.DeliverPolicy]
		if cfg.OptStartSeq > 0 {
			return badStart(name, "sequence")
		}
		if cfg.OptStartTime != nil {
			return badStart(name, "time")
		}
		if cfg.DeliverPolicy == server.DeliverLastPerSubject && len(ConsumerFilters(cfg)) == 0 {
			return notSet(name, "filter subject")
		}
	case server.DeliverByStartSequence:
		if cfg.OptStartSeq == 0 {
			return notSet("by start sequence", "start sequence")
		}
		if cfg.OptStartTime != nil {
			return badStart("by start sequence", "time")
		}
	case server.DeliverByStartTime:
		if cfg.OptStartTime == nil {
			return notSet("by start time", "start time")
		}
		if cfg.OptStartSeq != 0 {
			return badStart("by start time", "start sequence")
		}
	default:
		return server.NewJSConsumerInvalidPolicyError(errors.New("invalid deliver policy"))
	}
	return nil
}

// CheckConsumerUpdate reports why an existing consumer cannot take a new configuration,
// with nats-server's rules for what may change.
func CheckConsumerUpdate(old, cfg *server.ConsumerConfig) error {
	switch {
	case old.DeliverPolicy != cfg.DeliverPolicy:
		return errors.New("deliver policy can not be updated")
	case old.MemoryStorage != cfg.MemoryStorage:
		return errors.New("storage type can not be updated")
	case old.OptStartSeq != cfg.OptStartSeq:
		return errors.New("start sequence can not be updated")
	case (old.OptStartTime == nil) != (cfg.OptStartTime == nil) ||
		old.OptStartTime != nil && !old.OptStartTime.Equal(*cfg.OptStartTime):
		return errors.New("start time can not be updated")
	case old.AckPolicy != cfg.AckPolicy:
		return errors.New("ack policy can not be updated")
	case old.ReplayPolicy != cfg.ReplayPolicy:
		return errors.New("replay policy can not be updated")
	case old.MaxWaiting != cfg.MaxWaiting:
		return errors.New("max waiting can not be updated")
	}
	return nil
}

// SameConsumerConfig compares configurations the way a create without "update" does:
// metadata the server stamps (keys starting "_nats.") does not count.
func SameConsumerConfig(a, b server.ConsumerConfig) bool {
	strip := func(m map[string]string) map[string]string {
		out := maps.Clone(m)
		for k := range out {
			if strings.HasPrefix(k, "_nats.") {
				delete(out, k)
			}
		}
		if len(out) == 0 {
			return nil
		}
		return out
	}
	a.Metadata, b.Metadata = strip(a.Metadata), strip(b.Metadata)
	return reflect.DeepEqual(a, b)
}

// ConsumerFilters is the consumer's subject filters as one list; empty means everything.
func ConsumerFilters(cfg *server.ConsumerConfig) []string {
	if cfg.FilterSubject != "" {
		return []string{cfg.FilterSubject}
	}
	return cfg.FilterSubjects
}
