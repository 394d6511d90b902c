package retention

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/jetgres/jetgres/internal/jswire"
)

// WorkQueueConflict is nats-server's check that a consumer on a workqueue stream does not
// share messages with another: no second unfiltered consumer, and no filter that collides
// with another consumer's. An existing consumer being updated is only checked for
// collisions, as nats-server does. It returns the refusal, or the store's error when the
// consumers could not be listed.
func (e *Enforcer[S]) WorkQueueConflict(ctx context.Context, s S, name string, cfg *server.ConsumerConfig) (*server.ApiError, error) {
	if s.ConfigView().Retention != server.WorkQueuePolicy {
		return nil, nil
	}
	rows, err := e.store.Consumers(ctx, s.ID())
	if err != nil {
		return nil, err
	}
	filters := jswire.ConsumerFilters(cfg)
	exists := false
	var others [][]string
	for _, row := range rows {
		if row.Name == name {
			exists = true
			continue
		}
		var oc server.ConsumerConfig
		if err := json.Unmarshal(row.Config, &oc); err != nil {
			return server.NewJSConsumerCreateError(fmt.Errorf("consumer %q: stored config does not decode", row.Name)), nil
		}
		others = append(others, jswire.ConsumerFilters(&oc))
	}
	if len(others) == 0 {
		return nil, nil
	}
	if len(filters) == 0 && !exists {
		return server.NewJSConsumerWQMultipleUnfilteredError(), nil
	}
	for _, f := range filters {
		for _, of := range others {
			if len(of) == 0 {
				return server.NewJSConsumerWQConsumerNotUniqueError(), nil
			}
			for _, g := range of {
				if server.SubjectsCollide(f, g) {
					return server.NewJSConsumerWQConsumerNotUniqueError(), nil
				}
			}
		}
	}
	return nil, nil
}
