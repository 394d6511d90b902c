package natsd_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetgres/jetgres/embedded/natsd"
	"github.com/jetgres/jetgres/internal/testwait"
)

// Two servers routed with ClusterConfig form one cluster: a message published on one reaches
// a subscriber on the other, and clients learn the other's URL.
func TestClusterRoutes(t *testing.T) {
	t.Parallel()
	a := start(t, natsd.Config{Cluster: natsd.ClusterConfig{Listen: "127.0.0.1:0", Name: "c1"}})
	b := start(t, natsd.Config{Cluster: natsd.ClusterConfig{Listen: "127.0.0.1:0", Name: "c1", Routes: []string{a.ClusterURL()}}})
	if a.ClusterName() != "c1" || b.ClusterName() != "c1" {
		t.Fatalf("cluster names %q and %q, want c1", a.ClusterName(), b.ClusterName())
	}
	testwait.For(t, 10*time.Second, func() error {
		if n := a.NATSServer().NumRoutes(); n < 1 {
			return fmt.Errorf("%d routes", n)
		}
		return nil
	})
	na, err := nats.Connect(a.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer na.Close()
	nb, err := nats.Connect(b.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nb.Close()
	sub, err := nb.SubscribeSync("across")
	if err != nil {
		t.Fatal(err)
	}
	if err := nb.Flush(); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 10*time.Second, func() error {
		if err := na.Publish("across", []byte("x")); err != nil {
			return err
		}
		if _, err := sub.NextMsg(100 * time.Millisecond); err != nil {
			return fmt.Errorf("no message across the route: %w", err)
		}
		return nil
	})
	testwait.For(t, 10*time.Second, func() error {
		if len(na.DiscoveredServers()) == 0 {
			return fmt.Errorf("the client on one server has not learned the other's URL")
		}
		return nil
	})
}

func TestClusterWithoutListen(t *testing.T) {
	t.Parallel()
	if err := (natsd.Config{Cluster: natsd.ClusterConfig{Routes: []string{"nats://127.0.0.1:1"}}}).Check(); err == nil {
		t.Fatal("routes without a route listener were accepted")
	}
	s := start(t, natsd.Config{})
	if s.ClusterURL() != "" || s.ClusterName() != "" {
		t.Fatalf("a server without a cluster reports %q named %q", s.ClusterURL(), s.ClusterName())
	}
}
