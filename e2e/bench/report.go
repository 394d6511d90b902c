package bench

import "time"

// Target names, as they appear in the report.
const (
	TargetJetgres       = "jetgres"
	TargetJetgresFixed  = "jetgres-fixed160"
	TargetJetStream     = "jetstream"
	TargetJetStreamSync = "jetstream-sync"
	TargetPostgres      = "postgres-naive"
	TargetNaiveBridge   = "naive-bridge"
)

// targetLabels are the column headings of the tables.
var targetLabels = map[string]string{
	TargetJetgres:       "jetgres",
	TargetJetgresFixed:  "jetgres, fixed 160",
	TargetJetStream:     "JetStream",
	TargetJetStreamSync: "JetStream sync_always",
	TargetPostgres:      "naive INSERT",
	TargetNaiveBridge:   "naive bridge",
}

// Report is everything a run measured. It is what --json prints.
type Report struct {
	Command  string        `json:"command"`
	Started  time.Time     `json:"started"`
	Seconds  float64       `json:"seconds"`
	Machine  Machine       `json:"machine"`
	Settings RunSettings   `json:"settings"`
	Publish  []PubResult   `json:"publish,omitempty"`
	Sync     []SyncResult  `json:"sync_publish,omitempty"`
	Fetch    []FetchResult `json:"fetch,omitempty"`
	Push     []PushResult  `json:"push,omitempty"`
	Latency  []LatResult   `json:"latency,omitempty"`
	Overload []Overload    `json:"overload,omitempty"`
	// Sweep is the fusion sweep, when its section ran; SweepSkipped says why it did not.
	Sweep        []SweepLevel `json:"sweep,omitempty"`
	SweepSkipped string       `json:"sweep_skipped,omitempty"`
	// NatsBench is what natscli's nats bench measured, when its section ran.
	NatsBench *NatsBench `json:"nats_bench,omitempty"`
	Goals     []Goal     `json:"goals,omitempty"`
	// Statements are the statements PostgreSQL spent the most time on over the whole run,
	// from pg_stat_statements, when the server has it.
	Statements []StatementStats `json:"statements,omitempty"`
	// Errors name every measurement that failed; the rest of the run went on without it.
	Errors []string `json:"errors,omitempty"`
}

// Machine describes where the run happened.
type Machine struct {
	CPU        string `json:"cpu"`
	Cores      int    `json:"cores"`
	MemoryGiB  int    `json:"memory_gib"`
	OS         string `json:"os"`
	Go         string `json:"go"`
	PostgreSQL string `json:"postgresql"`
	// Fsync and SynchronousCommit are read from the server the run used.
	Fsync             string `json:"fsync"`
	SynchronousCommit string `json:"synchronous_commit"`
	NATSServer        string `json:"nats_server"`
	NATSGo            string `json:"nats_go"`
	Database          string `json:"database"` // "private cluster" or "given by URL"
	Jetgres           string `json:"jetgres"`  // "in-process" or "given by URL"
}

// RunSettings are the sizes the run used after defaults.
type RunSettings struct {
	Msgs            int      `json:"msgs"`
	Size            int      `json:"size"`
	DurationSeconds float64  `json:"duration_seconds"`
	Window          int      `json:"window"`
	FetchBatch      int      `json:"fetch_batch"`
	KVKeys          int      `json:"kv_keys"`
	ObjectBytes     int      `json:"object_bytes"`
	Rates           []int    `json:"rates"`
	OverloadStreams int      `json:"overload_streams"`
	Quick           bool     `json:"quick"`
	Sections        []string `json:"sections"`
}

// LatencySummary condenses a latency distribution, in microseconds.
type LatencySummary struct {
	Count  uint64  `json:"count"`
	MeanUs float64 `json:"mean_us"`
	P50us  float64 `json:"p50_us"`
	P90us  float64 `json:"p90_us"`
	P99us  float64 `json:"p99_us"`
	P999us float64 `json:"p999_us"`
	MaxUs  float64 `json:"max_us"`
}

// PubResult is one target's async publish throughput.
type PubResult struct {
	Target     string  `json:"target"`
	Sent       int     `json:"sent"`
	Acked      int     `json:"acked"`
	Failed     int     `json:"failed"`
	Seconds    float64 `json:"seconds"`
	MsgsPerSec float64 `json:"msgs_per_sec"`
	MBPerSec   float64 `json:"mb_per_sec"`
	Inside     *Inside `json:"inside,omitempty"`
}

// Inside is what jetgres's own metrics say about a phase (in-process jetgres only): the
// means of publish receipt → PubAck, of one append transaction, and of the messages that share
// one. Set beside a client's numbers they show where a publish spends its time.
type Inside struct {
	PubAckUs  float64 `json:"pub_ack_us"`
	CommitUs  float64 `json:"commit_us"`
	BatchMsgs float64 `json:"batch_msgs"`
}

// SyncResult is one target's lone synchronous publisher.
type SyncResult struct {
	Target     string         `json:"target"`
	MsgsPerSec float64        `json:"msgs_per_sec"`
	Latency    LatencySummary `json:"latency"`
	Inside     *Inside        `json:"inside,omitempty"`
	hist       *Histogram
}

// FetchResult is one target's fetch + ack throughput.
type FetchResult struct {
	Target     string  `json:"target"`
	Msgs       int     `json:"msgs"`
	Seconds    float64 `json:"seconds"`
	MsgsPerSec float64 `json:"msgs_per_sec"`
}

// PushResult is one target's push delivery throughput in one mode (PushModes).
type PushResult struct {
	Target     string  `json:"target"`
	Mode       string  `json:"mode"`
	Msgs       int     `json:"msgs"`
	Seconds    float64 `json:"seconds"`
	MsgsPerSec float64 `json:"msgs_per_sec"`
	// CPUUsPerMsg is the CPU time per message of the bench process (jetgres, both NATS
	// servers and the clients live in it), and PGCPUUsPerMsg that of the PostgreSQL server,
	// when the bench can read its processes.
	CPUUsPerMsg   float64 `json:"cpu_us_per_msg,omitempty"`
	PGCPUUsPerMsg float64 `json:"pg_cpu_us_per_msg,omitempty"`
}

// LatResult holds the three latencies of one target at one offered rate.
type LatResult struct {
	Target string `json:"target"`
	// Rate is the offered rate and Achieved what the publisher managed to send.
	Rate       int            `json:"rate"`
	Achieved   float64        `json:"achieved_per_sec"`
	Producer   LatencySummary `json:"producer"`
	Subscriber LatencySummary `json:"subscriber"`
	EndToEnd   LatencySummary `json:"end_to_end"`
	// Delivered counts messages the end-to-end consumer received, of Acked published.
	Acked     int `json:"acked"`
	Delivered int `json:"delivered"`
	hists     [3]*Histogram
}

// Overload is one target's sweep from 1× to 10× of its capacity.
type Overload struct {
	Target string `json:"target"`
	// LoneP50us is the unloaded sync publish latency that turns publishers into an offered
	// rate: n publishers offer n / LoneP50 messages per second.
	LoneP50us float64 `json:"lone_p50_us"`
	// Capacity is the throughput of the calibration step, with CalibrationPublishers.
	Capacity              float64        `json:"capacity_per_sec"`
	CalibrationPublishers int            `json:"calibration_publishers"`
	Steps                 []OverloadStep `json:"steps"`
	// Peak is the highest throughput of any step, calibration included.
	Peak float64 `json:"peak_per_sec"`
}

// OverloadStep is one load level of an overload sweep.
type OverloadStep struct {
	Multiple   float64        `json:"multiple"`
	Publishers int            `json:"publishers"`
	Offered    float64        `json:"offered_per_sec"`
	MsgsPerSec float64        `json:"msgs_per_sec"`
	Errors     int            `json:"errors"`
	Latency    LatencySummary `json:"latency"`
	// AppendLimit is the append lane's limit at the end of the step (jetgres in-process only).
	AppendLimit int `json:"append_limit,omitempty"`
}

// NatsBench is the nats bench section: the natscli it ran, its message counts, and a result
// per command and target, or why it was skipped.
type NatsBench struct {
	CLIVersion string            `json:"cli_version,omitempty"`
	Skipped    string            `json:"skipped,omitempty"`
	Msgs       int               `json:"msgs"`
	SyncMsgs   int               `json:"sync_msgs"`
	Size       int               `json:"size"`
	Results    []NatsBenchResult `json:"results,omitempty"`
}

// NatsBenchResult is one nats bench command against one target, as nats bench reports it:
// the aggregate rate, and the latency percentiles of one operation (zero where it measures
// none, or per batch).
type NatsBenchResult struct {
	Bench      string  `json:"bench"`
	Clients    int     `json:"clients"`
	Target     string  `json:"target"`
	MsgsPerSec float64 `json:"msgs_per_sec"`
	P50us      float64 `json:"p50_us,omitempty"`
	P90us      float64 `json:"p90_us,omitempty"`
	P99us      float64 `json:"p99_us,omitempty"`
}

// Goal is one of the targets issue #7 sets, checked against this run.
type Goal struct {
	Name string `json:"name"`
	Want string `json:"want"`
	Got  string `json:"got"`
	Met  bool   `json:"met"`
	Gap  string `json:"gap,omitempty"`
}

// StatementStats is one line of pg_stat_statements.
type StatementStats struct {
	Query   string  `json:"query"`
	Calls   int64   `json:"calls"`
	TotalMs float64 `json:"total_ms"`
	MeanMs  float64 `json:"mean_ms"`
	Rows    int64   `json:"rows"`
}
