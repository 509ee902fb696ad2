package testwait

import (
	"fmt"
	"testing"
	"time"
)

func TestPollAtOnce(t *testing.T) {
	calls := 0
	start := time.Now()
	if !Poll(time.Hour, func() bool { calls++; return true }) {
		t.Fatal("Poll = false for a condition that holds")
	}
	if calls != 1 || time.Since(start) > time.Second {
		t.Errorf("%d calls in %v, want 1 at once", calls, time.Since(start))
	}
}

func TestPollLater(t *testing.T) {
	calls := 0
	if !Poll(10*time.Second, func() bool { calls++; return calls == 5 }) {
		t.Fatal("Poll = false for a condition that holds at the fifth call")
	}
	if calls != 5 {
		t.Errorf("%d calls, want 5", calls)
	}
}

// TestPollDeadline: a condition that never holds is given up on at the
// deadline, after a last call made at or after it.
func TestPollDeadline(t *testing.T) {
	const limit = 200 * time.Millisecond
	start := time.Now()
	var last time.Time
	calls := 0
	if Poll(limit, func() bool { calls++; last = time.Now(); return false }) {
		t.Fatal("Poll = true for a condition that never holds")
	}
	if took := time.Since(start); took < limit {
		t.Errorf("gave up after %v, before the limit %v", took, limit)
	}
	if last.Sub(start) < limit {
		t.Errorf("last call %v after the start, before the limit %v", last.Sub(start), limit)
	}
	if calls < 2 {
		t.Errorf("%d calls in %v", calls, limit)
	}
}

type fakeT struct{ msg string }

func (f *fakeT) Helper() {}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
}

func TestFor(t *testing.T) {
	var ok fakeT
	For(&ok, "nothing", time.Second, func() bool { return true })
	if ok.msg != "" {
		t.Errorf("For failed a condition that holds: %s", ok.msg)
	}
	var late fakeT
	For(&late, "the impossible", 20*time.Millisecond, func() bool { return false })
	if want := "timed out after 20ms waiting for the impossible"; late.msg != want {
		t.Errorf("For's failure: %q, want %q", late.msg, want)
	}
}
