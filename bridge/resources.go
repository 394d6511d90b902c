package bridge

import (
	"context"
	"sync/atomic"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/pg"
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

// stored adds what a commit of this process stored in s to its storage type's usage, when
// that type has a bound.
func (b *Bridge) stored(s *stream, msgs []pg.Message) {
	cfg := s.cfgView()
	if b.bound(cfg.Storage) <= 0 {
		return
	}
	var bytes uint64
	for _, m := range msgs {
		bytes += pg.MessageSize(cfg.Storage == server.MemoryStorage, m.Subject, m.Header, m.Data)
	}
	b.usage.of(cfg.Storage).Add(int64(bytes))
}

// storageSums is what the streams of each storage type hold and reserve: a stream with
// max_bytes reserves that much of its type, as nats-server counts it.
type storageSums struct {
	memory, file                 uint64
	reservedMemory, reservedFile uint64
}

// sumByStorage adds up by storage type the bytes totals gives each stream (nil: none) and
// what each reserves, leaving out the stream named skip.
func (b *Bridge) sumByStorage(totals map[int64]pg.StreamTotals, skip string) storageSums {
	var sums storageSums
	for _, s := range b.streamList() {
		if s.name == skip {
			continue
		}
		cfg := s.cfgView()
		held, reserved := totals[s.id].Bytes, uint64(max(cfg.MaxBytes, 0))
		if cfg.Storage == server.MemoryStorage {
			sums.memory, sums.reservedMemory = sums.memory+held, sums.reservedMemory+reserved
		} else {
			sums.file, sums.reservedFile = sums.file+held, sums.reservedFile+reserved
		}
	}
	return sums
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
	sums := b.sumByStorage(totals, "")
	b.usage.memory.Store(int64(sums.memory))
	b.usage.file.Store(int64(sums.file))
	return nil
}

// checkReservation refuses a stream whose max_bytes would take the reservations of its
// storage type past its bound, as nats-server refuses it (10028 for memory, 10047 for file).
// Called with adminMu held, so that two creates cannot both take the last room.
func (b *Bridge) checkReservation(name string, cfg *server.StreamConfig) *server.ApiError {
	max := b.bound(cfg.Storage)
	if max <= 0 || cfg.MaxBytes <= 0 {
		return nil
	}
	others := b.sumByStorage(nil, name)
	if cfg.Storage == server.MemoryStorage {
		if uint64(cfg.MaxBytes)+others.reservedMemory > uint64(max) {
			return server.NewJSMemoryResourcesExceededError()
		}
		return nil
	}
	if uint64(cfg.MaxBytes)+others.reservedFile > uint64(max) {
		return server.NewJSStorageResourcesExceededError()
	}
	return nil
}
