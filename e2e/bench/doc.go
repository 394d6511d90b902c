// Package bench is the engine behind cmd/jetgres-bench: one run, on one machine, that drives
// jetgres, an embedded nats-server with JetStream file storage (default sync and sync_always)
// and a naive "one INSERT per publish" PostgreSQL baseline with the same client code, and
// reports each number beside the same number for JetStream.
//
// The machine it runs on is usually shared and noisy, so absolute numbers mean little from one
// run to the next; every table therefore carries ratios between targets measured in the same
// run, section by section, so that the targets see the same noise.
//
// What it measures, and how (the three latencies follow three-latencies.md: producer,
// subscriber and end-to-end are separate numbers with separate bottlenecks):
//
//   - pub: async publish throughput (PublishAsync with a bounded window of acks outstanding),
//     and the latency of a lone synchronous publisher (p50 / p99);
//   - fetch: fetch + ack throughput of a pull consumer (Fetch of a batch, an explicit ack per
//     message) over a stream filled beforehand;
//   - push: push delivery throughput of nats.go's js.Subscribe over a stream filled
//     beforehand, with ack explicit, with ack none and as an ordered consumer;
//   - latency: at fixed offered rates, the producer latency (publish → PubAck), the
//     subscriber latency (pull request → first message, while a backlog is ready) and the
//     end-to-end latency (publish → delivery to a consumer reading with Messages, from a send
//     time stamped in the payload);
//   - overload: closed-loop synchronous publishers spread over many streams, from 1× to 10×
//     of the target's measured capacity, throughput and p99 per step; for jetgres once with
//     the Vegas limiter and once with the limiter replaced by a fixed concurrency of 160;
//   - sweep: closed-loop synchronous publishers (1 to 256) over 1, 16 or 256 streams, jetgres
//     cold (a fresh node and pool) and warm, against the naive bridge (a plain NATS server
//     whose responders store each request with one INSERT) and the naive INSERT;
//
// Every load is bounded in messages and in time and stops by itself, and every server the
// bench starts or accepts listens on loopback only: the bench is a load generator, and it
// refuses to aim one at another machine.
package bench
