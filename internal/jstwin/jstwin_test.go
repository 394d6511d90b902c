package jstwin

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestStart checks that the server answers the JetStream API on file storage, and that Stop
// leaves nothing running.
func TestStart(t *testing.T) {
	for _, syncAlways := range []bool{false, true} {
		s, err := Start(Config{StoreDir: t.TempDir(), SyncAlways: syncAlways})
		if err != nil {
			t.Fatal(err)
		}
		func() {
			defer s.Stop()
			nc, err := nats.Connect(s.ClientURL())
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s"}, Storage: jetstream.FileStorage})
			if err != nil {
				t.Fatalf("sync_always=%t: create stream: %v", syncAlways, err)
			}
			if _, err := js.Publish(ctx, "s", []byte("x")); err != nil {
				t.Fatalf("sync_always=%t: publish: %v", syncAlways, err)
			}
			info, err := st.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if info.State.Msgs != 1 {
				t.Errorf("sync_always=%t: %d messages stored, want 1", syncAlways, info.State.Msgs)
			}
		}()
	}
}

func TestStartNeedsStoreDir(t *testing.T) {
	if s, err := Start(Config{}); err == nil {
		s.Stop()
		t.Fatal("Start without a store directory succeeded")
	}
}
