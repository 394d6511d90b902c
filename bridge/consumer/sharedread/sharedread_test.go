package sharedread

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jetgres/jetgres/internal/testwait"
	"github.com/jetgres/jetgres/pg"
)

// blockedRead is a read that returns once released, counting how often it was made.
type blockedRead struct {
	started chan struct{}
	release chan struct{}
}

func (b *blockedRead) read(ctx context.Context, p pg.ReadParams, _ []string) ([]pg.Message, uint64, error) {
	b.started <- struct{}{}
	<-b.release
	return []pg.Message{{Seq: p.From}}, p.UpTo, nil
}

type result struct {
	msgs   []pg.Message
	joined bool
}

func TestReadsJoinTheSameReadInFlightUntilForgotten(t *testing.T) {
	ctx := context.Background()
	b := &blockedRead{started: make(chan struct{}, 3), release: make(chan struct{})}
	var r Reads
	p := pg.ReadParams{From: 5, UpTo: 9}
	out := make(chan result, 3)
	read := func() {
		msgs, _, joined, err := r.Read(ctx, p, []string{"a"}, b.read)
		if err != nil {
			t.Error(err)
		}
		out <- result{msgs, joined}
	}
	go read()
	<-b.started
	go read()
	// The second reader waits for the read in flight rather than making its own.
	testwait.For(t, 5*time.Second, func() error {
		select {
		case <-b.started:
			t.Fatal("a reader of the same rows read them again")
		default:
		}
		buf := make([]byte, 1<<20)
		for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			if strings.Contains(g, "[select]") && strings.Contains(g, "sharedread.(*Reads).Read(") && !strings.Contains(g, "blockedRead") {
				return nil
			}
		}
		return errors.New("the second reader is not waiting for the read in flight yet")
	})
	r.Forget()
	go read()
	select {
	case <-b.started:
	case <-time.After(5 * time.Second):
		t.Fatal("a read after Forget joined the read in flight")
	}
	close(b.release)
	joined := 0
	for range 3 {
		res := <-out
		if len(res.msgs) != 1 || res.msgs[0].Seq != 5 {
			t.Fatalf("read %v", res.msgs)
		}
		if res.joined {
			joined++
		}
	}
	if joined != 1 {
		t.Fatalf("%d readers joined, want 1", joined)
	}
}
