package bdi

import (
	"testing"
	"testing/synctest"
	"time"
)

// TestHoldMutexMax: MaxHold is the longest hold so far; a shorter one
// later does not lower it.
func TestHoldMutexMax(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var m holdMutex
		if m.MaxHold() != 0 {
			t.Fatalf("unused: %v", m.MaxHold())
		}
		for _, hold := range []time.Duration{3 * time.Millisecond, 5 * time.Millisecond, time.Millisecond} {
			m.Lock()
			time.Sleep(hold)
			m.Unlock()
		}
		if got := m.MaxHold(); got != 5*time.Millisecond {
			t.Fatalf("MaxHold = %v after holds of 3, 5 and 1 ms, want 5ms", got)
		}
	})
}
