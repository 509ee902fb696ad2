package bdi

import (
	"testing"
	"testing/synctest"
	"time"
)

// simulate drives a window in virtual time against a device whose write
// rate follows rate(t): every bandwidthInterval the window is updated
// with the bandwidth as flusherd measures it (the smoothed figure of
// writeBandwidth, and the last period's own rate), and flusherd keeps the
// whole window in flight (a backlog that never ends).
// It records, per update, the window and the wait a write queued behind
// it would see (window / rate).
type simSample struct {
	at     time.Duration
	window int64
	wait   time.Duration
}

func simulate(t *testing.T, w *inflightWindow, total time.Duration, rate func(time.Duration) float64) []simSample {
	t.Helper()
	var out []simSample
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var bw, avg uint64 // kB/s
		for time.Since(start) < total {
			time.Sleep(bandwidthInterval)
			at := time.Since(start)
			r := rate(at)
			bw, avg = writeBandwidth(bw, avg, uint64(r*bandwidthInterval.Seconds()), bandwidthInterval)
			inflight := w.size()
			n := w.update(bw*1024, uint64(r), inflight)
			out = append(out, simSample{at: at, window: n, wait: time.Duration(float64(n) / r * float64(time.Second))})
		}
	})
	return out
}

const mib = 1 << 20

// TestWindowConverges: on a 40 MiB/s device a 25 ms target settles at
// 1 MiB (25 ms of the device), from the floor, within 2 s.
func TestWindowConverges(t *testing.T) {
	var w inflightWindow
	w.set(25*time.Millisecond, 16*mib)
	if w.size() != windowFloor {
		t.Fatalf("starts at %d, want the floor %d", w.size(), windowFloor)
	}
	ss := simulate(t, &w, 5*time.Second, func(time.Duration) float64 { return 40 * mib })
	for _, s := range ss {
		if s.at >= 2*time.Second && (s.window < 1*mib*95/100 || s.window > 1*mib*105/100) {
			t.Fatalf("at %v the window is %d, want about %d", s.at, s.window, 1*mib)
		}
		if s.window > 1*mib*105/100 {
			t.Fatalf("at %v the window overshoots: %d", s.at, s.window)
		}
	}
}

// TestWindowBacksOffAndRecovers: when the device slows to a quarter
// (another load takes it), the window shrinks so that the wait stays near
// the target, within one update past twice the target; when the device is
// back, the window grows back to where it was.
func TestWindowBacksOffAndRecovers(t *testing.T) {
	var w inflightWindow
	target := 25 * time.Millisecond
	w.set(target, 16*mib)
	rate := func(at time.Duration) float64 {
		if at >= 3*time.Second && at < 6*time.Second {
			return 10 * mib
		}
		return 40 * mib
	}
	ss := simulate(t, &w, 9*time.Second, rate)
	var slowLast, fastAgain int64
	for i, s := range ss {
		switch {
		case s.at >= 3*time.Second && s.at < 6*time.Second:
			// The first update of the slow device already acts.
			if s.wait > 2*target+target/2 {
				t.Errorf("at %v (device slowed) the wait is %v, window %d", s.at, s.wait, s.window)
			}
			slowLast = s.window
		case s.at >= 8*time.Second:
			fastAgain = s.window
		}
		if i > 0 && s.at == 3*time.Second+bandwidthInterval && s.window >= ss[i-1].window {
			t.Errorf("at %v the window did not come down: %d after %d", s.at, s.window, ss[i-1].window)
		}
	}
	if slowLast > 300<<10 {
		t.Errorf("window on the slow device %d, want about 256 KiB (25 ms of 10 MiB/s)", slowLast)
	}
	if fastAgain < 1*mib*95/100 {
		t.Errorf("window 2 s after the device recovered: %d, want about 1 MiB", fastAgain)
	}
}

// TestWindowFloorAndCeiling: a device too slow for the target keeps the
// floor (writeback is never starved below it); a fast one gets the
// ceiling; with no target the window is the ceiling, and 0 stays "no
// bound".
func TestWindowFloorAndCeiling(t *testing.T) {
	var w inflightWindow
	w.set(25*time.Millisecond, 16*mib)
	for _, s := range simulate(t, &w, 3*time.Second, func(time.Duration) float64 { return 1 * mib }) {
		if s.window != windowFloor {
			t.Fatalf("at %v on a 1 MiB/s device the window is %d, want the floor", s.at, s.window)
		}
	}
	w.set(25*time.Millisecond, 16*mib)
	ss := simulate(t, &w, 5*time.Second, func(time.Duration) float64 { return 2048 * mib })
	if got := ss[len(ss)-1].window; got != 16*mib {
		t.Errorf("a 2 GiB/s device: window %d, want the ceiling %d", got, 16*mib)
	}
	w.set(0, 16*mib)
	if w.size() != 16*mib || w.update(40*mib, 40*mib, 16*mib) != 16*mib {
		t.Errorf("no target: window %d, want the ceiling", w.size())
	}
	w.set(0, 0)
	if w.size() != 0 {
		t.Errorf("no target, no ceiling: window %d, want 0 (no bound)", w.size())
	}
	w.set(25*time.Millisecond, 0)
	ss = simulate(t, &w, 5*time.Second, func(time.Duration) float64 { return 400 * mib })
	if got, want := ss[len(ss)-1].window, int64(10*mib); got < want*95/100 || got > want*105/100 {
		t.Errorf("no ceiling, 400 MiB/s: window %d, want about %d", got, want)
	}
}

// TestWindowSlowStart: until the bandwidth is known the window grows by a
// quarter per update while at least half of it is in use, and not when it
// is idle.
func TestWindowSlowStart(t *testing.T) {
	var w inflightWindow
	w.set(25*time.Millisecond, 16*mib)
	if got := w.update(0, 0, 0); got != windowFloor {
		t.Errorf("idle: %d, want the floor", got)
	}
	if got := w.update(0, 0, windowFloor); got != windowFloor+windowFloor/4 {
		t.Errorf("in use: %d, want %d", got, windowFloor+windowFloor/4)
	}
	// A reload with a new ceiling keeps the window within it.
	w.set(25*time.Millisecond, windowFloor)
	if w.size() != windowFloor {
		t.Errorf("after a smaller ceiling: %d", w.size())
	}
}
