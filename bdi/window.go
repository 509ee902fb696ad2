package bdi

import (
	"sync/atomic"
	"time"
)

// windowFloor is the smallest window: flusherd always keeps this much
// writeback in flight when it has work (config.MinMaxInflight).
const windowFloor = 256 << 10

// inflightWindow sets how many bytes flusherd keeps under writeback on a
// device so that a write queued behind them waits about target: by
// Little's law that wait is the bytes ahead of it over the device's write
// rate, so the window is target × rate, between windowFloor and ceil
// (plug.max_inflight_bytes). Modelled on blk-wbt (block/blk-wbt.c:
// wb_timer_fn's scale_up and scale_down of the queue depth against
// wbt_lat_usec), with the latency estimated from the rate and the bytes in
// flight instead of sampled from completions:
//
//   - the rate is the last period's own rate while flusherd kept the
//     device busy (half the window or more in flight), else the smoothed
//     write bandwidth (BdiWriteBandwidth): a device that slows down
//     (another load, a throttle) or recovers is seen in one period, not
//     after the smoothing's seconds;
//   - a window above target × rate comes down to it at once;
//   - one below goes up by a quarter per update (scale_up's step), so a
//     device that speeds up is followed without a burst;
//   - when the bytes in flight would take over twice target to write at
//     the last period's rate, the window is halved (scale_down) whatever
//     the smoothed figure says;
//   - until the bandwidth is known it starts at the floor and grows as
//     above while in use (slow start).
//
// The device's goroutine owns it and alone calls set and update; the
// window's size is read anywhere.
type inflightWindow struct {
	target time.Duration // 0: off, the window is ceil
	ceil   int64         // plug.max_inflight_bytes; 0: no bound
	cur    atomic.Int64
}

// set gives the window its target and ceiling (a configuration, or a
// reload's): with no target it is the ceiling; turned on it starts at the
// floor, and a running one is kept within the new bounds.
func (w *inflightWindow) set(target time.Duration, ceil int64) {
	was := w.target
	w.target, w.ceil = target, ceil
	switch {
	case target <= 0:
		w.cur.Store(ceil)
	case was <= 0:
		w.cur.Store(w.clamp(windowFloor))
	default:
		w.cur.Store(w.clamp(w.cur.Load()))
	}
}

// clamp bounds n to [windowFloor, ceil].
func (w *inflightWindow) clamp(n int64) int64 {
	n = max(n, windowFloor)
	if w.ceil > 0 {
		n = min(n, max(w.ceil, windowFloor))
	}
	return n
}

// size is the window in bytes: what may be under writeback on the device
// before big files, ranges and background work wait; 0: no bound.
func (w *inflightWindow) size() int64 { return w.cur.Load() }

// update adapts the window to the device's smoothed write bandwidth bps
// and its last period's rate inst (bytes/s; 0: not known) and the bytes of
// flusherd's writeback in flight, and returns the new window.
func (w *inflightWindow) update(bps, inst uint64, inflight int64) int64 {
	if w.target <= 0 {
		return w.cur.Load()
	}
	cur := w.cur.Load()
	grow := w.clamp(cur + cur/4)
	busy := inflight >= cur/2
	rate := bps
	if busy && inst > 0 {
		rate = inst
	}
	switch {
	case rate == 0:
		// Slow start: the bandwidth is not known yet.
		if busy {
			cur = grow
		}
	case inst > 0 && float64(inflight)/float64(inst) > 2*w.target.Seconds():
		cur = w.clamp(cur / 2)
	default:
		want := w.clamp(int64(w.target.Seconds() * float64(rate)))
		cur = min(want, grow)
	}
	w.cur.Store(cur)
	return cur
}
