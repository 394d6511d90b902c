package jswire

import (
	"maps"
	"strconv"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
)

// The metadata nats-server writes into stream and consumer configs: the API level an asset
// needs (_nats.req.level), stored with its config, and the server's version and API level
// (_nats.ver, _nats.level), added to every response and never stored. Clients read them
// (the CLI's "Required API Level" lines); a user's own keys stay as the request gave them.

// APILevel is the JetStream API level jetgres serves: what $JS.API.INFO and the _nats.level
// metadata report, and the most a request's Nats-Required-Api-Level may ask for. Clients gate
// features on it before they ask (the nats CLI refuses `pub --atomic` below 2), so it is the
// level of the latest feature jetgres implements: 2, atomic batch publish, counters and
// message schedules (nats-server 2.12).
const APILevel = 2

// SetStaticStreamMetadata sets the API level cfg needs, as nats-server does on create and
// update, and drops the response-only keys a request may carry back.
func SetStaticStreamMetadata(cfg *server.StreamConfig) {
	level := 0
	if cfg.AllowMsgTTL || cfg.SubjectDeleteMarkerTTL > 0 {
		level = max(level, 1)
	}
	if cfg.AllowMsgCounter || cfg.AllowAtomicPublish || cfg.AllowMsgSchedules || cfg.PersistMode == server.AsyncPersistMode {
		level = max(level, 2)
	}
	if cfg.AllowBatchPublish {
		level = max(level, 4)
	}
	cfg.Metadata = withLevel(cfg.Metadata, level)
}

// SetStaticConsumerMetadata is SetStaticStreamMetadata for a consumer's config.
func SetStaticConsumerMetadata(cfg *server.ConsumerConfig) {
	level := 0
	if cfg.PauseUntil != nil && !cfg.PauseUntil.IsZero() {
		level = max(level, 1)
	}
	if cfg.PriorityPolicy != server.PriorityNone || cfg.PinnedTTL != 0 || len(cfg.PriorityGroups) > 0 {
		level = max(level, 1)
	}
	if cfg.AckPolicy == server.AckFlowControl {
		level = max(level, 4)
	}
	cfg.Metadata = withLevel(cfg.Metadata, level)
}

func withLevel(md map[string]string, level int) map[string]string {
	out := make(map[string]string, len(md)+1)
	maps.Copy(out, md)
	delete(out, server.JSServerVersionMetadataKey)
	delete(out, server.JSServerLevelMetadataKey)
	out[server.JSRequiredLevelMetadataKey] = strconv.Itoa(level)
	return out
}

// StreamConfigForResponse is cfg as a response reports it: its stored metadata, the version
// of the NATS server jetgres embeds and the API level jetgres serves.
func StreamConfigForResponse(cfg server.StreamConfig) server.StreamConfig {
	cfg.Metadata = withServerLevel(cfg.Metadata)
	return cfg
}

// ConsumerConfigForResponse is StreamConfigForResponse for a consumer's config.
func ConsumerConfigForResponse(cfg *server.ConsumerConfig) *server.ConsumerConfig {
	if cfg == nil {
		return nil
	}
	out := *cfg
	out.Metadata = withServerLevel(cfg.Metadata)
	return &out
}

func withServerLevel(md map[string]string) map[string]string {
	out := make(map[string]string, len(md)+2)
	maps.Copy(out, md)
	out[server.JSServerVersionMetadataKey] = server.VERSION
	out[server.JSServerLevelMetadataKey] = strconv.Itoa(APILevel)
	return out
}

// userMetadata is md without the keys the server stamps (those starting "_nats."), nil when
// nothing is left: what decides whether two configs are the same.
func userMetadata(md map[string]string) map[string]string {
	out := maps.Clone(md)
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
