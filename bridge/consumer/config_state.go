package consumer

import (
	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/bridge/consumerstate"
)

// stateConfig is what the ack state machine needs from a consumer configuration.
func stateConfig(cfg *server.ConsumerConfig) consumerstate.Config {
	sc := consumerstate.Config{
		AckWait:       cfg.AckWait,
		BackOff:       cfg.BackOff,
		MaxDeliver:    cfg.MaxDeliver,
		MaxAckPending: cfg.MaxAckPending,
	}
	switch cfg.AckPolicy {
	case server.AckNone:
		sc.AckPolicy = consumerstate.AckNone
	case server.AckAll:
		sc.AckPolicy = consumerstate.AckAll
	default:
		sc.AckPolicy = consumerstate.AckExplicit
	}
	return sc
}
