package bridge

import (
	"context"
	"sync/atomic"

	"github.com/nats-io/nats-server/v2/server"
)

// reasonResources labels publishes refused because the streams of their storage type hold
// more than Config.MaxMemory or Config.MaxStore.
const reasonResources = "resources"

// storeUsage is what the streams of each storage type hold, in bytes, for Config.MaxMemory
// and Config.MaxStore. The maintainer reads it from PostgreSQL every maintainPeriod, which
// takes in other replicas' commits and what retention removed; this process's commits add to
// it at once, so that the publish after the one that passed the bound is refused, as in
// nats-server, which checks what is stored before it stores a message.
type storeUsage struct {
	memory, file atomic.Int64
}

func (u *storeUsage) of(storage server.StorageType) *atomic.Int64 {
	if storage == server.MemoryStorage {
		return &u.memory
	}
	return &u.file
}

// bounded reports whether a storage type has a bound, and which.
func (b *Bridge) bound(storage server.StorageType) int64 {
	if storage == server.MemoryStorage {
		return b.cfg.MaxMemory
	}
	return b.cfg.MaxStore
}

// overBound reports whether the streams of a publish's storage type hold more than their
// bound. It runs on the link's read loop: two atomic loads.
func (b *Bridge) overBound(cfg *server.StreamConfig) bool {
	max := b.bound(cfg.Storage)
	return max > 0 && b.usage.of(cfg.Storage).Load() > max
}

// stored adds the bytes a commit of this process stored to its storage type's usage.
func (b *Bridge) stored(cfg *server.StreamConfig, bytes uint64) {
	if b.bound(cfg.Storage) > 0 {
		b.usage.of(cfg.Storage).Add(int64(bytes))
	}
}

// refreshUsage reads what every stream holds, for the bounds that are set.
func (b *Bridge) refreshUsage(ctx context.Context) error {
	if b.cfg.MaxMemory <= 0 && b.cfg.MaxStore <= 0 {
		return nil
	}
	totals, err := b.db.AllTotals(ctx)
	if err != nil {
		return err
	}
	var memory, file int64
	for _, s := range b.streamList() {
		if s.cfgView().Storage == server.MemoryStorage {
			memory += int64(totals[s.id].Bytes)
		} else {
			file += int64(totals[s.id].Bytes)
		}
	}
	b.usage.memory.Store(memory)
	b.usage.file.Store(file)
	return nil
}

// checkReservation refuses a stream whose max_bytes would take the reservations of its
// storage type past its bound, as nats-server refuses it (10028 for memory, 10047 for file):
// each stream with max_bytes reserves that much.
func (b *Bridge) checkReservation(name string, cfg *server.StreamConfig) *server.ApiError {
	max := b.bound(cfg.Storage)
	if max <= 0 || cfg.MaxBytes <= 0 {
		return nil
	}
	reserved := cfg.MaxBytes
	for _, s := range b.streamList() {
		if o := s.cfgView(); s.name != name && o.Storage == cfg.Storage && o.MaxBytes > 0 {
			reserved += o.MaxBytes
		}
	}
	if reserved <= max {
		return nil
	}
	if cfg.Storage == server.MemoryStorage {
		return server.NewJSMemoryResourcesExceededError()
	}
	return server.NewJSStorageResourcesExceededError()
}
