// Package wake owns the one way a goroutine is woken in this module: a channel of capacity
// one that a sender pokes without waiting, so that many wake-ups before the goroutine
// looks count as one.
package wake

// Poke wakes whoever waits on ch, a channel of capacity one, without waiting itself: a
// wake-up already pending covers this one.
func Poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
