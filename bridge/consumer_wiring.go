package bridge

import (
	"github.com/jetgres/jetgres/bridge/consumer"
	"github.com/jetgres/jetgres/bridge/ownership"
	"github.com/jetgres/jetgres/bridge/retention"
	"github.com/jetgres/jetgres/bridge/stream"
)

const (
	// TickPeriodDefault is Config.TickPeriod's default; see consumer.TickPeriodDefault.
	TickPeriodDefault = consumer.TickPeriodDefault
	// TickIdleMaxDefault is how far the ticker, and the SQL mover's look for new rows, back
	// off while nothing moves.
	TickIdleMaxDefault = consumer.TickIdleMaxDefault
	// CursorIntervalDefault is Config.CursorInterval's default.
	CursorIntervalDefault = consumer.CursorIntervalDefault
	// LeaseDefault is Config.Lease's default.
	LeaseDefault = ownership.LeaseDefault
	// ReadAheadMsgs and ReadAheadBytes cap one read of PostgreSQL for a consumer behind the
	// tail; see consumer.ReadAheadMsgs.
	ReadAheadMsgs  = consumer.ReadAheadMsgs
	ReadAheadBytes = consumer.ReadAheadBytes
)

// The consumer engine takes acks and consumer changes to retention through this.
var _ consumer.Retention = (*retention.Enforcer[*stream.Stream])(nil)

// newConsumers builds the bridge's consumer engine (bridge/consumer). The streams'
// events reach it once New subscribes it to the registry.
func newConsumers(b *Bridge) (*consumer.Engine, error) {
	return consumer.New(consumer.Config{
		Store:          b.db,
		Link:           b.link,
		Pop:            b.cfg.Pop,
		Ack:            b.cfg.Ack,
		Clock:          b.clock,
		Logger:         b.log,
		Registerer:     b.cfg.Registerer,
		Streams:        b.streams,
		Retention:      b.retention,
		TickPeriod:     b.cfg.TickPeriod,
		CursorInterval: b.cfg.CursorInterval,
		Lease:          b.cfg.Lease,
		ReplicaName:    b.cfg.ReplicaName,
		ClusterName:    b.cfg.ClusterName,
		TailBytes:      TailBytesDefault,
	})
}
