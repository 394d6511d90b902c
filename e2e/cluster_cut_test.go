package e2e

// A replica cut off from PostgreSQL while its NATS side lives: a proxy that can partition it,
// and the test that it stops delivering within its lease and is taken over only once
// PostgreSQL has ended its session.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetgres/jetgres/internal/testwait"
)

// cutProxy forwards TCP connections to PostgreSQL's Unix socket until it is cut: then it
// forwards nothing more, in either direction, and keeps every connection open, as a network
// partition does. sever closes them, as PostgreSQL does once its keepalives give up; heal
// lets new connections through again.
type cutProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	healed chan struct{} // closed by heal
	conns  []net.Conn
}

func startCutProxy(t *testing.T, socket string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: socket, healed: make(chan struct{})}
	t.Cleanup(func() {
		_ = ln.Close()
		p.sever()
		p.heal() // lets the pipes that wait on the cut see their connections closed
	})
	go p.accept()
	return p
}

func (p *cutProxy) port() int { return p.ln.Addr().(*net.TCPAddr).Port }

func (p *cutProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.serve(c)
	}
}

func (p *cutProxy) serve(c net.Conn) {
	p.mu.Lock()
	cut, healed := p.cut, p.healed
	p.conns = append(p.conns, c)
	p.mu.Unlock()
	if cut {
		<-healed
	}
	up, err := net.Dial("unix", p.target)
	if err != nil {
		_ = c.Close()
		return
	}
	p.mu.Lock()
	p.conns = append(p.conns, up)
	p.mu.Unlock()
	go p.pipe(up, c)
	p.pipe(c, up)
}

// pipe copies from src to dst until either fails; once cut, what it reads goes nowhere and
// it reads no more. A close is a packet like any other: one that comes while cut reaches
// dst only when the proxy heals or severs, or a replica that gives up on its connection
// would end its session in PostgreSQL at once, as no partition lets it.
func (p *cutProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		p.mu.Lock()
		cut, healed := p.cut, p.healed
		p.mu.Unlock()
		if err != nil {
			if cut {
				<-healed
			}
			_ = dst.Close()
			return
		}
		if cut {
			<-healed
			_ = dst.Close()
			_ = src.Close()
			return
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			_ = src.Close()
			return
		}
	}
}

func (p *cutProxy) cutOff() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
}

func (p *cutProxy) sever() {
	p.mu.Lock()
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

func (p *cutProxy) heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		p.cut = false
		close(p.healed)
		p.healed = make(chan struct{})
	}
}

// TestReplicaCutFromDatabase cuts the replica serving a consumer off from PostgreSQL (each
// replica reaches it through a proxy of its own) while its NATS side lives and it still
// holds messages in memory: it stops delivering within the
// lease, and no other replica delivers until PostgreSQL has ended the cut replica's session.
func TestReplicaCutFromDatabase(t *testing.T) {
	t.Parallel()
	// A lease of 4 s gives each ownership statement 400 ms: with 200 ms, a loaded machine
	// made the victim miss one and fence before the cut, and the test measured nothing.
	const (
		stream = "CUT"
		lease  = 4 * time.Second
	)
	pgs := startPGServer(t)
	var proxies []*cutProxy
	var dsns []string
	for range 3 {
		p := startCutProxy(t, filepath.Join(pgs.dir, ".s.PGSQL.5432"))
		proxies = append(proxies, p)
		dsns = append(dsns, loopbackDSN(p.port()))
	}
	c := newClusterOn(t, dsns, "--lease", lease.String())
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	_, js1 := c.rep(0).connect(t)
	if _, err := js1.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{"cut.>"}}); err != nil {
		t.Fatal(err)
	}
	cons1, err := js1.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "work", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	victim := -1
	if l := cons1.CachedInfo().Cluster; l != nil {
		_, _ = fmt.Sscanf(l.Leader, "r%d", &victim)
		victim--
	}
	if victim < 0 {
		t.Fatalf("consumer info names no serving replica: %+v", cons1.CachedInfo().Cluster)
	}
	proxy := proxies[victim]
	publishAll(t, ctx, js1, "cut.x", 3000, func(int) []byte { return []byte("x") })

	log := &deliveryLog{counts: make(map[uint64]int)}
	_, js2 := c.rep((victim + 1) % 3).connect(t)
	cons, err := js2.Consumer(ctx, stream, "work")
	if err != nil {
		t.Fatal(err)
	}
	fetchCtx, stopFetch := context.WithCancel(ctx)
	defer stopFetch()
	var fetchWG sync.WaitGroup
	fetchWG.Go(func() {
		for fetchCtx.Err() == nil {
			batch, err := cons.Fetch(5, jetstream.FetchMaxWait(200*time.Millisecond))
			if err != nil {
				continue
			}
			for m := range batch.Messages() {
				if md, err := m.Metadata(); err == nil {
					log.note(md.Sequence.Stream, md.NumDelivered > 1)
				}
				_ = m.Ack()
			}
			time.Sleep(20 * time.Millisecond) // a slow client, so that r1 still holds most
		}
	})
	testwait.For(t, time.Minute, func() error {
		if n := log.distinct(); n < 200 {
			return fmt.Errorf("%d delivered", n)
		}
		return nil
	})
	proxy.cutOff()
	cutAt := time.Now()
	// Past the lease, nothing is delivered any more, by anyone.
	testwait.For(t, time.Minute, func() error {
		if time.Since(cutAt) < lease+time.Second {
			return errors.New("within the lease")
		}
		return nil
	})
	log.mu.Lock()
	last := log.times[len(log.times)-1]
	cutSeqs := make(map[uint64]bool, len(log.counts))
	for seq := range log.counts {
		cutSeqs[seq] = true
	}
	log.mu.Unlock()
	// While the proxy is cut PostgreSQL hears nothing from the cut replica, so its session
	// and lock hold: a takeover by now began before the cut, after a loaded replica missed
	// its statement timeout (a tenth of the lease) and fenced. The deliveries after the
	// cut are then the new server's, no measure of the cut replica's fence.
	for i := range 3 {
		if i == victim {
			continue
		}
		_, body := c.rep(i).mustGet(t, "/metrics")
		if n := metricValue(t, body, "jetgres_consumer_takeovers_total"); n > 0 {
			t.Fatalf("r%d took the consumer over while PostgreSQL still held the cut replica's session: it moved before the cut", i+1)
		}
	}
	stoppedAfter := last.Sub(cutAt)
	if stoppedAfter > lease {
		t.Errorf("the replica cut from the database delivered %v after the cut, beyond the lease (%v)", stoppedAfter, lease)
	}
	_, body := c.rep(victim).mustGet(t, "/metrics")
	if f := metricValue(t, body, "jetgres_consumer_fencings_total"); f < 1 {
		t.Errorf("jetgres_consumer_fencings_total = %v on the cut replica", f)
	}

	// PostgreSQL ends the cut replica's sessions; another replica takes over.
	severedAt := time.Now()
	proxy.sever()
	proxy.heal()
	testwait.For(t, 30*time.Second, func() error {
		if log.firstAfter(severedAt).IsZero() {
			return errors.New("no delivery since the sessions ended")
		}
		return nil
	})
	resumed := log.firstAfter(severedAt).Sub(severedAt)
	stopFetch()
	fetchWG.Wait()
	log.mu.Lock()
	again := 0
	for seq, n := range log.counts {
		if n > 1 && cutSeqs[seq] {
			again++
		}
	}
	log.mu.Unlock()
	t.Logf("FIGURES lease=%v delivered_after_cut=%v resumed_after_session_end=%v delivered_again_from_floor=%d", lease, stoppedAfter.Round(time.Millisecond), resumed.Round(time.Millisecond), again)
}
