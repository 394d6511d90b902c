package jswire

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
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
	// ackFlowControlHeartbeat is the heartbeat the flow_control ack policy implies and
	// requires: nats-server's stream source health interval.
	ackFlowControlHeartbeat = time.Second
	// pushHeartbeatMin is the shortest idle heartbeat a push consumer may ask for.
	pushHeartbeatMin = 100 * time.Millisecond
	// pinnedTTLDefault is how long a pinned client may go without asking before it loses
	// its pin, when pinned_ttl is not set.
	pinnedTTLDefault = 2 * time.Minute
)

// priorityGroupName is what a priority group may be called.
var priorityGroupName = regexp.MustCompile(`^[a-zA-Z0-9/_=-]{1,16}$`)

// ValidPriorityGroup reports whether a priority group may be called name.
func ValidPriorityGroup(name string) bool { return priorityGroupName.MatchString(name) }

// checkPriority applies nats-server's rules for priority groups: a policy needs a pull
// consumer and named groups, and groups or a pinned_ttl need a policy.
func checkPriority(cfg *server.ConsumerConfig) *server.ApiError {
	if cfg.PriorityPolicy == server.PriorityNone {
		switch {
		case len(cfg.PriorityGroups) > 0:
			return server.NewJSConsumerPriorityGroupWithPolicyNoneError()
		case cfg.PinnedTTL > 0:
			return server.NewJSConsumerPinnedTTLWithoutPriorityPolicyNoneError()
		}
		return nil
	}
	if cfg.DeliverSubject != "" {
		return server.NewJSConsumerPushWithPriorityGroupError()
	}
	if len(cfg.PriorityGroups) == 0 {
		return server.NewJSConsumerPriorityPolicyWithoutGroupError()
	}
	for _, g := range cfg.PriorityGroups {
		if g == "" {
			return server.NewJSConsumerEmptyGroupNameError()
		}
		if !priorityGroupName.MatchString(g) {
			return server.NewJSConsumerInvalidGroupNameError()
		}
	}
	return nil
}

// CheckConsumerConfig fills in JetStream's defaults and validates a requested consumer
// configuration, pull or push, against its stream, returning the JetStream error a client
// expects. Features jetgres does not serve are refused rather than ignored.
func CheckConsumerConfig(req server.ConsumerConfig, scfg *server.StreamConfig) (server.ConsumerConfig, *server.ApiError) {
	cfg := req
	// A direct consumer, what a stream copying from this one asks for, is served as any
	// other ephemeral one. A sourcing consumer needs an API level jetgres does not serve.
	if cfg.Sourcing {
		return cfg, server.NewJSConsumerCreateError(errors.New("sourcing consumers are not supported by jetgres"))
	}
	if cfg.PauseUntil != nil {
		utc := cfg.PauseUntil.UTC()
		cfg.PauseUntil = &utc
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
	cfg.Heartbeat = max(cfg.Heartbeat, 0)
	cfg.InactiveThreshold = max(cfg.InactiveThreshold, 0)
	cfg.PinnedTTL = max(cfg.PinnedTTL, 0)
	// A push consumer has no waiting requests to bound.
	if cfg.DeliverSubject == "" && cfg.MaxWaiting == 0 {
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
	if cfg.AckPolicy == server.AckFlowControl {
		cfg.FlowControl = true
		cfg.Heartbeat = ackFlowControlHeartbeat
	}
	if cfg.PriorityPolicy == server.PriorityPinnedClient && cfg.PinnedTTL == 0 {
		cfg.PinnedTTL = pinnedTTLDefault
	}
	if cfg.Durable == "" && cfg.InactiveThreshold == 0 {
		cfg.InactiveThreshold = ephemeralInactiveDefault
	}

	// Checks, in checkConsumerCfg's order.
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
	if cfg.AckPolicy < server.AckNone || cfg.AckPolicy > server.AckFlowControl {
		return cfg, server.NewJSConsumerAckPolicyInvalidError()
	}
	if cfg.ReplayPolicy != server.ReplayInstant && cfg.ReplayPolicy != server.ReplayOriginal {
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
	if e := checkAckFlowControl(&cfg); e != nil {
		return cfg, e
	}
	if n := len(cfg.BackOff); n > 0 && cfg.MaxDeliver != -1 && n > cfg.MaxDeliver {
		return cfg, server.NewJSConsumerMaxDeliverBackoffError()
	}
	if len(cfg.Description) > server.JSMaxDescriptionLen {
		return cfg, server.NewJSConsumerDescriptionTooLongError(server.JSMaxDescriptionLen)
	}
	if cfg.DeliverSubject != "" {
		if e := checkPush(&cfg, scfg); e != nil {
			return cfg, e
		}
	} else if e := checkPull(&cfg, scfg); e != nil {
		return cfg, e
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
	if cfg.FlowControl && cfg.Heartbeat == 0 {
		return cfg, server.NewJSConsumerWithFlowControlNeedsHeartbeatsError()
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
	if e := checkPriority(&cfg); e != nil {
		return cfg, e
	}
	if scfg.Retention == server.WorkQueuePolicy {
		if cfg.AckPolicy != server.AckExplicit && cfg.AckPolicy != server.AckFlowControl {
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

// checkAckFlowControl applies the rules of the flow_control ack policy, which needs a
// push consumer with flow control whose acks come only from flow-control responses.
func checkAckFlowControl(cfg *server.ConsumerConfig) *server.ApiError {
	if cfg.AckPolicy != server.AckFlowControl {
		return nil
	}
	switch {
	case cfg.DeliverSubject == "":
		return server.NewJSConsumerAckFCRequiresPushError()
	case !cfg.FlowControl:
		return server.NewJSConsumerAckFCRequiresFCError()
	case cfg.Heartbeat != ackFlowControlHeartbeat:
		return server.NewJSStreamInvalidConfigError(errors.New("flow control ack policy heartbeat needs to be 1s"))
	case cfg.MaxAckPending <= 0:
		return server.NewJSConsumerAckFCRequiresMaxAckPendingError()
	case cfg.AckWait != 0 || len(cfg.BackOff) > 0:
		return server.NewJSConsumerAckFCRequiresNoAckWaitError()
	case cfg.MaxDeliver > 0:
		return server.NewJSConsumerAckFCRequiresNoMaxDeliverError()
	}
	return nil
}

// checkPush applies the rules that only push consumers (with a deliver subject) have.
func checkPush(cfg *server.ConsumerConfig, scfg *server.StreamConfig) *server.ApiError {
	switch {
	case !literalSubject(cfg.DeliverSubject):
		return server.NewJSConsumerDeliverToWildcardsError()
	case !server.IsValidSubject(cfg.DeliverSubject) || reservedDeliverSubject(cfg.DeliverSubject):
		return server.NewJSConsumerInvalidDeliverSubjectError()
	case deliveryFormsCycle(cfg.DeliverSubject, scfg):
		return server.NewJSConsumerDeliverCycleError()
	case cfg.MaxWaiting != 0:
		return server.NewJSConsumerPushMaxWaitingError()
	case cfg.MaxAckPending > 0 && cfg.AckPolicy == server.AckNone:
		return server.NewJSConsumerMaxPendingAckPolicyRequiredError()
	case cfg.Heartbeat > 0 && cfg.Heartbeat < pushHeartbeatMin:
		return server.NewJSConsumerSmallHeartbeatError()
	}
	return nil
}

// checkPull applies the rules that only pull consumers have. nats-server accepts a
// deliver_group and max_request_* limits on either kind; only one kind uses each.
func checkPull(cfg *server.ConsumerConfig, scfg *server.StreamConfig) *server.ApiError {
	switch {
	case cfg.AckPolicy == server.AckNone && scfg.Retention == server.WorkQueuePolicy:
		return server.NewJSConsumerPullRequiresAckError()
	case cfg.RateLimit > 0:
		return server.NewJSConsumerPullWithRateLimitError()
	case cfg.Heartbeat > 0:
		return server.NewJSConsumerHBRequiresPushError()
	case cfg.FlowControl:
		return server.NewJSConsumerFCRequiresPushError()
	case cfg.MaxRequestExpires != 0 && cfg.MaxRequestExpires < time.Millisecond:
		return server.NewJSConsumerMaxRequestExpiresTooSmallError()
	}
	return nil
}

// literalSubject reports whether subject has no wildcard token; unlike
// server.IsValidLiteralSubject it does not judge the subject otherwise, so that a deliver
// subject gets nats-server's error for wildcards before the one for being invalid.
func literalSubject(subject string) bool {
	for tok := range strings.SplitSeq(subject, ".") {
		if tok == "*" || tok == ">" {
			return false
		}
	}
	return true
}

// reservedDeliverSubject reports whether messages may not be delivered to subject:
// JetStream's API, ack, flow-control, snapshot and event subjects (a domain's API too),
// and the reply subjects the server maps for services and gateways.
func reservedDeliverSubject(subject string) bool {
	for _, p := range []string{"_R_.", "_GR_.", "$GR."} {
		if strings.HasPrefix(subject, p) {
			return true
		}
	}
	rest, ok := strings.CutPrefix(subject, "$JS.")
	if !ok {
		return false
	}
	kind, rest, _ := strings.Cut(rest, ".")
	switch kind {
	case "API", "ACK", "FC", "SNAPSHOT", "EVENT":
		return true
	}
	domainKind, _, _ := strings.Cut(rest, ".")
	return domainKind == "API"
}

// deliveryFormsCycle reports whether the stream would store what is delivered to subject.
func deliveryFormsCycle(subject string, scfg *server.StreamConfig) bool {
	for _, s := range scfg.Subjects {
		if server.SubjectMatchesFilter(subject, s) {
			return true
		}
	}
	return false
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
		if cfg.OptStartSeq > MaxSeq {
			return server.NewJSConsumerInvalidPolicyError(fmt.Errorf("consumer optional start sequence (opt_start_seq) %d is above %d, the largest sequence jetgres stores", cfg.OptStartSeq, MaxSeq))
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
// with nats-server's rules for what may change. hasInterest reports whether a subject
// has subscribers: a push consumer may move to another deliver subject only while its
// current one has none. An *server.ApiError it returns is the answer as it is.
func CheckConsumerUpdate(old, cfg *server.ConsumerConfig, hasInterest func(subject string) bool) error {
	moved := old.DeliverSubject != cfg.DeliverSubject
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
	case old.Heartbeat != cfg.Heartbeat:
		return errors.New("heart beats can not be updated")
	case old.FlowControl != cfg.FlowControl:
		return errors.New("flow control can not be updated")
	case moved && old.DeliverSubject == "":
		return errors.New("can not update pull consumer to push based")
	case moved && cfg.DeliverSubject == "":
		return errors.New("can not update push consumer to pull based")
	case moved && hasInterest(old.DeliverSubject):
		return server.NewJSConsumerNameExistError()
	case old.MaxWaiting != cfg.MaxWaiting:
		return errors.New("max waiting can not be updated")
	}
	return nil
}

// SameConsumerConfig compares configurations the way a create without "update" does:
// metadata the server stamps (keys starting "_nats.") does not count.
func SameConsumerConfig(a, b server.ConsumerConfig) bool {
	a.Metadata, b.Metadata = userMetadata(a.Metadata), userMetadata(b.Metadata)
	return reflect.DeepEqual(a, b)
}

// ConsumerFilters is the consumer's subject filters as one list; empty means everything.
func ConsumerFilters(cfg *server.ConsumerConfig) []string {
	if cfg.FilterSubject != "" {
		return []string{cfg.FilterSubject}
	}
	return cfg.FilterSubjects
}

// FiltersMatch reports whether a consumer with these filters (ConsumerFilters) wants a
// message on subject.
func FiltersMatch(filters []string, subject string) bool {
	if len(filters) == 0 {
		return true
	}
	for _, f := range filters {
		// A literal filter is most often the subject itself, which needs no tokenizing: a
		// fifth of a push consumer's pump went to matching the filter js.Subscribe sets.
		if f == subject || server.SubjectMatchesFilter(subject, f) {
			return true
		}
	}
	return false
}

// SnapshotDeliverSubject reports whether a snapshot's chunks may go to subject, as
// nats-server checks a snapshot request's deliver_subject: a literal subject that is not
// reserved.
func SnapshotDeliverSubject(subject string) bool {
	return server.IsValidPublishSubject(subject) && !reservedDeliverSubject(subject)
}
