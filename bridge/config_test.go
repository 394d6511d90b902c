package bridge

import (
	"strings"
	"testing"
	"time"

	"github.com/jetgres/jetgres/embedded/leaf"
	"github.com/jetgres/jetgres/flow"
	"github.com/jetgres/jetgres/pg"
)

// validConfig has every required field; New touches none of them.
func validConfig(t *testing.T) Config {
	t.Helper()
	lane, err := flow.NewLane("test", flow.Options{Init: 1, Min: 1, Max: 1, Alpha: flow.AlphaDefault, Beta: flow.BetaDefault})
	if err != nil {
		t.Fatal(err)
	}
	return Config{DB: new(pg.DB), Link: new(leaf.Conn), Append: lane, Pop: lane, Ack: lane, ReplicaName: "r"}
}

func TestConfigZeroMeansDefault(t *testing.T) {
	b, err := New(validConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	c := b.cfg
	for _, f := range []struct {
		name      string
		got, want int64
	}{
		{"IntakeBytes", int64(c.IntakeBytes), IntakeBytesDefault},
		{"IntakeTotalBytes", int64(c.IntakeTotalBytes), IntakeTotalBytesDefault},
		{"TailTotalBytes", int64(c.TailTotalBytes), TailTotalBytesDefault},
		{"FlushMaxMsgs", int64(c.FlushMaxMsgs), FlushMaxMsgsDefault},
		{"FlushMaxStreams", int64(c.FlushMaxStreams), FlushMaxStreamsDefault},
		{"TickPeriod", int64(c.TickPeriod), int64(TickPeriodDefault)},
		{"CursorInterval", int64(c.CursorInterval), int64(CursorIntervalDefault)},
		{"MaxPayload", int64(c.MaxPayload), MaxPayloadDefault},
	} {
		if f.got != f.want {
			t.Errorf("zero %s became %d, want its default %d", f.name, f.got, f.want)
		}
	}
	if c.Logger == nil {
		t.Error("nil Logger was not replaced")
	}
}

// A missing, negative or absurd value is refused by name, never silently replaced.
func TestConfigRefusesBadValues(t *testing.T) {
	for _, tc := range []struct {
		field string
		set   func(*Config)
	}{
		{"Config.DB", func(c *Config) { c.DB = nil }},
		{"Config.Link", func(c *Config) { c.Link = nil }},
		{"Config.Ack", func(c *Config) { c.Ack = nil }},
		{"Config.ReplicaName", func(c *Config) { c.ReplicaName = "" }},
		{"Config.IntakeBytes", func(c *Config) { c.IntakeBytes = -1 }},
		{"Config.IntakeTotalBytes", func(c *Config) { c.IntakeTotalBytes = -1 }},
		{"Config.TailTotalBytes", func(c *Config) { c.TailTotalBytes = -1 }},
		{"Config.FlushMaxMsgs", func(c *Config) { c.FlushMaxMsgs = -1 }},
		{"Config.FlushMaxStreams", func(c *Config) { c.FlushMaxStreams = -1 }},
		{"Config.MaxPayload", func(c *Config) { c.MaxPayload = -1 }},
		{"Config.CursorInterval", func(c *Config) { c.CursorInterval = -time.Second }},
		{"Config.TickPeriod", func(c *Config) { c.TickPeriod = -time.Second }},
		{"Config.TickPeriod", func(c *Config) { c.TickPeriod = time.Microsecond }},
	} {
		cfg := validConfig(t)
		tc.set(&cfg)
		_, err := New(cfg)
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s set wrong: New err = %v, want one naming it", tc.field, err)
		}
	}
}
