package stream

import (
	"context"
	"sync/atomic"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/pg"
)

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
func (r *Registry) bound(storage server.StorageType) int64 {
	if storage == server.MemoryStorage {
		return r.cfg.MaxMemory
	}
	return r.cfg.MaxStore
}

// overBound reports whether the streams of a publish's storage type hold more than their
// bound. It runs on the link's read loop: two atomic loads.
func (r *Registry) overBound(cfg *server.StreamConfig) bool {
	max := r.bound(cfg.Storage)
	return max > 0 && r.usage.of(cfg.Storage).Load() > max
}

// stored adds what a commit of this process stored in s to its storage type's usage, when
// that type has a bound.
func (r *Registry) stored(s *Stream, msgs []pg.Message) {
	cfg := s.ConfigView()
	if r.bound(cfg.Storage) <= 0 {
		return
	}
	var bytes uint64
	for _, m := range msgs {
		bytes += pg.MessageSize(cfg.Storage == server.MemoryStorage, m.Subject, m.Header, m.Data)
	}
	r.usage.of(cfg.Storage).Add(int64(bytes))
}

// StorageSums is what the streams of each storage type hold and reserve: a stream with
// max_bytes reserves that much of its type, as nats-server counts it.
type StorageSums struct {
	Memory, File                 uint64
	ReservedMemory, ReservedFile uint64
}

// SumByStorage adds up by storage type the bytes totals gives each stream (nil: none) and
// what each reserves, leaving out the stream named skip.
func (r *Registry) SumByStorage(totals map[int64]pg.StreamTotals, skip string) StorageSums {
	var sums StorageSums
	for _, s := range r.List() {
		if s.name == skip {
			continue
		}
		cfg := s.ConfigView()
		held, reserved := totals[s.id].Bytes, uint64(max(cfg.MaxBytes, 0))
		if cfg.Storage == server.MemoryStorage {
			sums.Memory, sums.ReservedMemory = sums.Memory+held, sums.ReservedMemory+reserved
		} else {
			sums.File, sums.ReservedFile = sums.File+held, sums.ReservedFile+reserved
		}
	}
	return sums
}

// RefreshUsage reads what every stream holds, for the bounds that are set.
func (r *Registry) RefreshUsage(ctx context.Context) error {
	if r.cfg.MaxMemory <= 0 && r.cfg.MaxStore <= 0 {
		return nil
	}
	totals, err := r.cfg.DB.AllTotals(ctx)
	if err != nil {
		return err
	}
	sums := r.SumByStorage(totals, "")
	r.usage.memory.Store(int64(sums.Memory))
	r.usage.file.Store(int64(sums.File))
	return nil
}

// CheckReservation refuses a stream whose max_bytes would take the reservations of its
// storage type past its bound, as nats-server refuses it (10028 for memory, 10047 for file).
// Called with the admin lock held, so that two creates cannot both take the last room.
func (r *Registry) CheckReservation(name string, cfg *server.StreamConfig) *server.ApiError {
	max := r.bound(cfg.Storage)
	if max <= 0 || cfg.MaxBytes <= 0 {
		return nil
	}
	others := r.SumByStorage(nil, name)
	if cfg.Storage == server.MemoryStorage {
		if uint64(cfg.MaxBytes)+others.ReservedMemory > uint64(max) {
			return server.NewJSMemoryResourcesExceededError()
		}
		return nil
	}
	if uint64(cfg.MaxBytes)+others.ReservedFile > uint64(max) {
		return server.NewJSStorageResourcesExceededError()
	}
	return nil
}
