package nextsub

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetgres/jetgres/embedded/leaf"
)

// A consumer made again under its name replaces the old one's subscription, and the old
// one stopping late drops nothing of the new one's.
func TestOnlyTheHolderDropsItsSubscription(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := New[int](reg)
	ref := Ref{Stream: "S", Consumer: "C"}
	if got := ref.Subject(); got != "$JS.API.CONSUMER.MSG.NEXT.S.C" {
		t.Fatalf("subject %q", got)
	}
	oldSub, newSub := &leaf.Subscription{}, &leaf.Subscription{}
	if replaced := h.Put(ref, 1, oldSub); replaced != nil {
		t.Fatal("a first subscription replaced one")
	}
	if replaced := h.Put(ref, 2, newSub); replaced != oldSub {
		t.Fatal("the old consumer's subscription was not handed back")
	}
	if h.Drop(ref, 1) != nil || !h.Holds(ref) {
		t.Fatal("the old consumer dropped the new one's subscription")
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	served := -1.0
	for _, mf := range mfs {
		if mf.GetName() == "jetgres_consumers_served" {
			served = mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	if served != 1 {
		t.Fatalf("served gauge %v, want 1", served)
	}
	if h.Drop(ref, 2) != newSub || h.Holds(ref) {
		t.Fatal("the holder could not drop its subscription")
	}
}
