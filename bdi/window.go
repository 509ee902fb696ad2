package bdi

import (
	"sync/atomic"
	"time"
)

// windowFloor is the smallest window: flusherd always keeps this much
// writeback in flight when it has work (config.MinMaxInflight).
const windowFloor = 256 << 10

// windowStart is the window a target starts from, before anything is
// measured: 25 ms of a 40 MB/s disk.
const windowStart = 1 << 20

// inflightWindow sets how many bytes flusherd keeps under writeback on a
// device so that a write queued behind them waits about target. By
// Little's law that wait is the bytes in flight over the device's write
// rate (their drain time). Every bandwidth update (bandwidthInterval or
// more) it looks at the bytes of flusherd's writeback in flight and at
// the device's write rate over the last period, and, modelled on blk-wbt
// (block/blk-wbt.c: wb_timer_fn's scale_down and scale_up of the queue
// depth against wbt_lat_usec):
//
//   - the window is looked at only when it was the limit (an attempt was
//     deferred for want of room since the last update): otherwise the
//     rate is only what flusherd gave the device, which says nothing of
//     its speed, and the window stays; so it does when the drain is not
//     known (no range timed, nothing in flight at the update);
//   - drain time over target: the window comes down to target × rate, at
//     most halved per update, and never grows (scale_down); a period in
//     which the device wrote nothing while flusherd had writeback in
//     flight halves it;
//   - drain time under half the target: it doubles, the device has room
//     to spare (slow start);
//   - between half the target and the target: it grows by a quarter, at
//     most to target × rate (scale_up's step).
//
// It is kept between windowFloor and ceil (plug.max_inflight_bytes) and
// starts at windowStart. The device's goroutine owns it and alone calls
// set and update; the window's size is read anywhere.
type inflightWindow struct {
	target time.Duration // 0: off, the window is ceil
	ceil   int64         // plug.max_inflight_bytes; 0: no bound
	cur    atomic.Int64
}

// set gives the window its target and ceiling (a configuration, or a
// reload's): with no target it is the ceiling; turned on it starts at
// windowStart, and a running one is kept within the new bounds.
func (w *inflightWindow) set(target time.Duration, ceil int64) {
	was := w.target
	w.target, w.ceil = target, ceil
	switch {
	case target <= 0:
		w.cur.Store(ceil)
	case was <= 0:
		w.cur.Store(w.clamp(windowStart))
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

// update adapts the window to the device's write rate over the last
// period (bytes/s; 0: not measured), the bytes of flusherd's writeback in
// flight, the longest drain time a range writeback measured in the period
// (measured; 0: none, the drain is taken as inflight over rate), and
// whether an attempt was deferred for want of room since the last update.
// It returns the new window, and whether the drain was known and at least
// half the target: writes queue in the device, whose rate over the period
// is then its speed.
func (w *inflightWindow) update(rate uint64, inflight int64, measured time.Duration, deferred bool) (_ int64, queued bool) {
	cur := w.cur.Load()
	if w.target <= 0 {
		return cur, false
	}
	drain := time.Duration(-1) // not known
	switch {
	case measured > 0:
		drain = measured
	case rate > 0 && inflight > 0:
		drain = time.Duration(float64(inflight) / float64(rate) * float64(time.Second))
	case inflight > 0:
		drain = 2 * w.target // nothing written in the period: a stall
	}
	queued = drain >= w.target/2
	// The window that drains in the target: by the measured drain, or
	// by the rate (Little's law).
	little := int64(w.target.Seconds() * float64(rate))
	if measured > 0 {
		little = int64(float64(cur) * float64(w.target) / float64(measured))
	}
	switch {
	case !deferred:
		// Not the limit: the rate is what flusherd gave the device, and
		// the bytes in flight as last seen may be a range just started.
	case drain < 0:
		// Nothing in flight as last seen and no range timed: the
		// moment the window was the limit is gone, and how long its
		// bytes took is not known (not 0: the window stays).
	case drain > w.target:
		// Over the target never grows it: more than the window was in
		// flight (whole folios, starts racing for the last room).
		cur = w.clamp(min(cur, max(little, cur/2)))
	case drain < w.target/2:
		cur = w.clamp(2 * cur)
	default:
		cur = w.clamp(max(min(cur+cur/4, little), cur))
	}
	w.cur.Store(cur)
	return cur, queued
}
