// Package jstwin starts a real nats-server with JetStream, in-process, as the reference that
// jetgres is compared with side by side: the twin tests send the same client calls to both
// and compare the answers, and the benchmark measures both with the same client code.
package jstwin

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// readyTimeout bounds the wait for the server to accept clients.
const readyTimeout = 10 * time.Second

// Config configures Start.
type Config struct {
	// StoreDir is the directory of the JetStream file store. Required: the store is the
	// caller's to remove, usually a temporary directory.
	StoreDir string
	// SyncAlways makes the store fsync every message, the durability a PubAck from jetgres
	// promises. Defaults to false: the store syncs every two minutes, the server's default.
	SyncAlways bool
	// MaxMemory and MaxStore are the server's JetStream resources (max_memory_store and
	// max_file_store in its configuration), in bytes; 0 leaves nats-server's defaults.
	MaxMemory, MaxStore int64
	// Domain is the server's JetStream domain (jetstream.domain); "" is none.
	Domain string
}

// Twin is a running nats-server with JetStream on file storage, listening on a free
// loopback port.
type Twin struct {
	ns *server.Server
}

// Start starts the server and returns once it accepts clients. It does not log, and it
// leaves signals to the process.
func Start(cfg Config) (*Twin, error) {
	if cfg.StoreDir == "" {
		return nil, errors.New("jstwin: Config.StoreDir is empty")
	}
	ns, err := server.NewServer(&server.Options{
		Host:               "127.0.0.1",
		Port:               -1,
		JetStream:          true,
		StoreDir:           cfg.StoreDir,
		SyncAlways:         cfg.SyncAlways,
		JetStreamMaxMemory: cfg.MaxMemory,
		JetStreamMaxStore:  cfg.MaxStore,
		JetStreamDomain:    cfg.Domain,
		NoLog:              true,
		NoSigs:             true,
	})
	if err != nil {
		return nil, fmt.Errorf("jstwin: JetStream server (sync_always=%t): %w", cfg.SyncAlways, err)
	}
	ns.Start()
	if !ns.ReadyForConnections(readyTimeout) {
		ns.Shutdown()
		ns.WaitForShutdown()
		return nil, fmt.Errorf("jstwin: JetStream server (sync_always=%t): not ready within %s", cfg.SyncAlways, readyTimeout)
	}
	return &Twin{ns: ns}, nil
}

// ClientURL is the nats:// URL clients connect to.
func (s *Twin) ClientURL() string { return s.ns.ClientURL() }

// Stop shuts the server down and returns when it has stopped.
func (s *Twin) Stop() {
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
}
