package bdi

import (
	"testing"
	"testing/synctest"
	"time"
)

// simSample is the window at an update, and the wait a write queued
// behind it would see (window / rate).
type simSample struct {
	at     time.Duration
	window int64
	wait   time.Duration
}

// simulate drives a window in virtual time against a device whose write
// rate follows rate(t), flusherd keeping the whole window in flight (a
// backlog that never ends, so its attempts are deferred for want of room):
// every bandwidthInterval the window is updated with the last period's
// rate and the bytes in flight.
func simulate(t *testing.T, w *inflightWindow, total time.Duration, rate func(time.Duration) float64) []simSample {
	t.Helper()
	var out []simSample
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		for time.Since(start) < total {
			time.Sleep(bandwidthInterval)
			at := time.Since(start)
			r := rate(at)
			n, _ := w.update(uint64(r), w.size(), 0, true)
			out = append(out, simSample{at: at, window: n, wait: time.Duration(float64(n) / r * float64(time.Second))})
		}
	})
	return out
}

const mib = 1 << 20

// within5 reports whether got is within 5 % of want.
func within5(got, want int64) bool { return got >= want*95/100 && got <= want*105/100 }

// TestWindowConverges: on a 40 MiB/s device a 25 ms target settles at
// 1 MiB (25 ms of the device); on a 10 MiB/s one it comes down to 256 KiB
// within a second and stays; on an 80 MiB/s one it grows to 2 MiB.
func TestWindowConverges(t *testing.T) {
	for _, c := range []struct {
		rate float64
		want int64
	}{{40 * mib, 1 * mib}, {10 * mib, 256 << 10}, {80 * mib, 2 * mib}} {
		var w inflightWindow
		w.set(25*time.Millisecond, 16*mib)
		if w.size() != windowStart {
			t.Fatalf("starts at %d, want %d", w.size(), windowStart)
		}
		for _, s := range simulate(t, &w, 5*time.Second, func(time.Duration) float64 { return c.rate }) {
			if s.at >= time.Second && !within5(s.window, c.want) {
				t.Errorf("%.0f MiB/s: at %v the window is %d, want about %d", c.rate/mib, s.at, s.window, c.want)
				break
			}
		}
	}
}

// TestWindowBacksOffAndRecovers: when the device slows to a quarter
// (another load takes it), the window shrinks in one update so that the
// wait stays near the target; when the device is back, the window grows
// back to where it was.
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
			if s.at > 3*time.Second+bandwidthInterval && s.wait > target+target/20 {
				t.Errorf("at %v (device slowed) the wait is %v, window %d", s.at, s.wait, s.window)
			}
			slowLast = s.window
		case s.at >= 8*time.Second:
			fastAgain = s.window
		}
		if i > 0 && s.at == 3*time.Second && s.window >= ss[i-1].window {
			t.Errorf("at %v the window did not come down: %d after %d", s.at, s.window, ss[i-1].window)
		}
	}
	if !within5(slowLast, 256<<10) {
		t.Errorf("window on the slow device %d, want about 256 KiB (25 ms of 10 MiB/s)", slowLast)
	}
	if !within5(fastAgain, 1*mib) {
		t.Errorf("window 2 s after the device recovered: %d, want about 1 MiB", fastAgain)
	}
}

// TestWindowFloorAndCeiling: a device too slow for the target keeps the
// floor (writeback is never starved below it); a fast one reaches the
// ceiling; with no target the window is the ceiling, and 0 stays "no
// bound".
func TestWindowFloorAndCeiling(t *testing.T) {
	var w inflightWindow
	w.set(25*time.Millisecond, 16*mib)
	for _, s := range simulate(t, &w, 3*time.Second, func(time.Duration) float64 { return 1 * mib }) {
		if s.window < windowFloor {
			t.Fatalf("at %v on a 1 MiB/s device the window is %d, under the floor", s.at, s.window)
		}
		if s.at >= time.Second && s.window != windowFloor {
			t.Fatalf("at %v on a 1 MiB/s device the window is %d, want the floor", s.at, s.window)
		}
	}
	w.set(25*time.Millisecond, 16*mib)
	ss := simulate(t, &w, 5*time.Second, func(time.Duration) float64 { return 2048 * mib })
	if got := ss[len(ss)-1].window; got != 16*mib {
		t.Errorf("a 2 GiB/s device: window %d, want the ceiling %d", got, 16*mib)
	}
	w.set(0, 16*mib)
	if got, _ := w.update(40*mib, 16*mib, 0, true); w.size() != 16*mib || got != 16*mib {
		t.Errorf("no target: window %d, want the ceiling", w.size())
	}
	w.set(0, 0)
	if w.size() != 0 {
		t.Errorf("no target, no ceiling: window %d, want 0 (no bound)", w.size())
	}
	w.set(25*time.Millisecond, 0)
	ss = simulate(t, &w, 5*time.Second, func(time.Duration) float64 { return 400 * mib })
	if got := ss[len(ss)-1].window; !within5(got, 10*mib) {
		t.Errorf("no ceiling, 400 MiB/s: window %d, want about %d", got, 10*mib)
	}
}

// TestWindowNotInUse: a window that is not the limit (nothing deferred)
// stays, however low the rate and however much was in flight at the last
// look: a device that writes only what flusherd gives it says nothing of
// its speed, nor does a period whose drain is not known. A period with
// writeback in flight, attempts deferred and nothing written halves it.
func TestWindowNotInUse(t *testing.T) {
	var w inflightWindow
	w.set(25*time.Millisecond, 16*mib)
	if got, _ := w.update(100<<10, 0, 0, false); got != windowStart {
		t.Errorf("idle at 100 KiB/s: %d, want it kept at %d", got, windowStart)
	}
	if got, _ := w.update(2<<20, 256<<10, 0, false); got != windowStart {
		t.Errorf("a range in flight, nothing deferred, at 2 MiB/s: %d, want it kept at %d", got, windowStart)
	}
	if got, _ := w.update(0, 0, 0, true); got != windowStart {
		t.Errorf("deferred, rate and drain unknown: %d, want it kept at %d", got, windowStart)
	}
	if got, _ := w.update(0, 64<<10, 0, true); got != windowStart/2 {
		t.Errorf("a stall (in flight, nothing written): %d, want halved to %d", got, windowStart/2)
	}
	// A reload with a smaller ceiling keeps the window within it.
	w.set(25*time.Millisecond, windowFloor)
	if w.size() != windowFloor {
		t.Errorf("after a smaller ceiling: %d", w.size())
	}
}

// TestWindowMeasuredDrain: with a drain time that a range writeback
// measured, the window is judged by it and not by the bytes over the
// rate (which, on a device flusherd does not keep busy, is the rate
// flusherd gave it); the update says whether writes queue in the device
// (a drain of at least half the target).
func TestWindowMeasuredDrain(t *testing.T) {
	const target = 25 * time.Millisecond
	for _, c := range []struct {
		name     string
		rate     uint64
		inflight int64
		measured time.Duration
		deferred bool
		want     int64
		queued   bool
	}{
		// 1 MiB just started at 10 MiB/s looks like 100 ms of queue.
		{"by rate: a range just started", 10 * mib, 1 * mib, 0, true, 512 << 10, true},
		{"measured: the device wrote it in 3 ms", 10 * mib, 1 * mib, 3 * time.Millisecond, true, 2 * mib, false},
		{"measured: 20 ms, grows by a quarter at most", 10 * mib, 1 * mib, 20 * time.Millisecond, true, 1*mib + 256<<10, true},
		{"measured: 40 ms, down to what drains in the target", 10 * mib, 1 * mib, 40 * time.Millisecond, true, 640 << 10, true},
		{"measured: 200 ms, halved at most", 10 * mib, 1 * mib, 200 * time.Millisecond, true, 512 << 10, true},
		// 4 MiB in flight against a 1 MiB window at 80 MiB/s: 50 ms, over
		// the target, though 2 MiB would drain in it: kept, not grown.
		{"by rate: more in flight than the window, over the target", 80 * mib, 4 * mib, 0, true, 1 * mib, true},
		{"measured, not deferred: kept", 10 * mib, 1 * mib, 3 * time.Millisecond, false, 1 * mib, false},
		// Deferred earlier in the period, nothing in flight at its end:
		// how long the bytes took is not known, not 0.
		{"not measured, nothing in flight: kept", 40 * mib, 0, 0, true, 1 * mib, false},
		{"not measured, nothing written, nothing in flight: kept", 0, 0, 0, true, 1 * mib, false},
	} {
		var w inflightWindow
		w.set(target, 16*mib)
		got, queued := w.update(c.rate, c.inflight, c.measured, c.deferred)
		if got != c.want || queued != c.queued {
			t.Errorf("%s: window %d, queued %v; want %d, %v", c.name, got, queued, c.want, c.queued)
		}
	}
}
