package consumerstate

import "github.com/nats-io/nats-server/v2/server"

// ConfigOf is what the state machine needs of a consumer's JetStream configuration.
func ConfigOf(cfg *server.ConsumerConfig) Config {
	sc := Config{
		AckWait:       cfg.AckWait,
		BackOff:       cfg.BackOff,
		MaxDeliver:    cfg.MaxDeliver,
		MaxAckPending: cfg.MaxAckPending,
		FlowControl:   cfg.FlowControl,
	}
	switch cfg.AckPolicy {
	case server.AckNone:
		sc.AckPolicy = AckNone
	case server.AckAll, server.AckFlowControl:
		// The flow_control ack policy acks as AckAll does; its acks come from flow-control
		// answers, which the consumer hands to Ack.
		sc.AckPolicy = AckAll
	default:
		sc.AckPolicy = AckExplicit
	}
	return sc
}
