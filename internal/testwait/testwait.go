// Package testwait waits in tests for a condition that something outside
// the test makes true (a daemon, the kernel's flusher, a loop device
// letting go): it polls the condition until a deadline.
//
// The poll interval starts at MinInterval and doubles up to MaxInterval,
// so a condition that holds soon is seen soon and a long wait costs few
// calls; the condition is called once more at the deadline, so a test
// that oversleeps on a loaded machine still gets the final answer.
package testwait

import "time"

// The first and the longest interval between two calls of a condition.
const (
	MinInterval = 5 * time.Millisecond
	MaxInterval = 50 * time.Millisecond
)

// T is what For needs of its caller (a *testing.T or *testing.B).
type T interface {
	Helper()
	Fatalf(format string, args ...any)
}

// Poll calls cond until it returns true or limit has passed, and reports
// whether it did.
func Poll(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for interval := MinInterval; ; interval = min(2*interval, MaxInterval) {
		if cond() {
			return true
		}
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		time.Sleep(min(interval, left))
	}
}

// For is Poll that fails the test when cond does not hold within limit,
// saying how long it waited for what.
func For(t T, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	if !Poll(limit, cond) {
		t.Fatalf("timed out after %v waiting for %s", limit, what)
	}
}
