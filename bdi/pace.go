package bdi

import (
	"sync"
	"time"
)

// Pacing: flusherd starts writeback on a device at a pace below the
// device's measured write rate, so that the device's queue (and a rate
// limiter's budget, blk-throttle's 100 ms slice) keeps room for another
// program's write: the in-flight window bounds how much may wait ahead of
// that write, the pace how often there is any.
const (
	// paceGain is the pace against the estimated device rate (BBR's
	// pacing_gain below 1: a queue that drains).
	paceGain = 0.8
	// paceProbeGain is the pace of a probe, one bandwidth period every
	// paceProbeEvery of paced writeback: the device may have become
	// faster (BBR's ProbeBW gain).
	paceProbeGain  = 1.25
	paceProbeEvery = time.Minute
	// paceStart is the first pace (bytes/s), doubled every bandwidth
	// period the pace held flusherd back (slow start) until the device
	// is the limit (see paceControl) for paceLearn in a row; paceJudge
	// is how long the device must be the limit, once the estimate is
	// made, for a new one.
	paceStart = 16 << 20
	paceLearn = 2 * bandwidthInterval
	paceJudge = time.Second
	// paceShort: a period in which flusherd's writeback queued in the
	// device (the window held it back) and the device wrote less than
	// this share of the pace shows the device slower than the pace, even
	// if the pace held flusherd back too (the bucket's bursts fill the
	// window while the device lags).
	paceShort = 0.9
	// paceMin is the slowest pace (bytes/s): writeback is never starved
	// below it.
	paceMin = 1 << 20
	// paceBurst is the bucket's depth in time at the pace: what may start
	// at once after a pause (at least windowFloor).
	paceBurst = 50 * time.Millisecond
	// paceOwed is the most of the pace kept for a start that was refused
	// and has not come back yet.
	paceOwed = 200 * time.Millisecond
)

// pacer is a token bucket on the bytes flusherd puts under writeback on a
// device: room says how many may start now, take charges what started
// (which may overdraw it: a small file goes whole). Attempts on workers
// and range writeback call it; the device's goroutine sets the rate.
type pacer struct {
	mu sync.Mutex
	// +checklocks:mu
	rate float64 // bytes/s; 0: not pacing
	// +checklocks:mu
	tokens float64
	// +checklocks:mu
	last time.Duration
	// full: the bucket was full at some refill since the last drain
	// (flusherd did not use all the pace allowed).
	// +checklocks:mu
	full bool
	// waited: a start was refused for want of tokens since the last
	// drain; owed: since the last take.
	// +checklocks:mu
	waited bool
	// +checklocks:mu
	owed bool
	// cut: a start was cut short by the pace since the last drain
	// (held): the pace was the limit, even though the bucket refills
	// to full between the checks of a caller that borrows its span.
	// +checklocks:mu
	cut bool
}

// depthLocked is the bucket's depth in bytes. Preconditions: p.mu held.
//
// +checklocks:p.mu
func (p *pacer) depthLocked() float64 {
	return max(p.rate*paceBurst.Seconds(), windowFloor)
}

// +checklocks:p.mu
func (p *pacer) refillLocked(now time.Duration) {
	if now > p.last {
		p.tokens += p.rate * (now - p.last).Seconds()
		p.last = now
	}
	d := p.depthLocked()
	if p.owed {
		// A start refused since the last take: the pace is owed to it,
		// however late it comes back (a worker delayed by the CPU), up
		// to paceOwed.
		d = max(p.rate*paceOwed.Seconds(), d)
	}
	if p.tokens >= d {
		p.tokens, p.full = d, true
	}
}

// room is how many bytes may start under writeback at now (daemon
// clock), for a caller that comes back every span (0: at will): the
// tokens in the bucket, and for a span past paceBurst the pace of the
// rest of it, borrowed (the range writeback of a background check would
// otherwise get at most paceBurst's worth per check); no bound when not
// pacing. A start refused (no tokens) is remembered for the controller.
func (p *pacer) room(now, span time.Duration) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.rate <= 0 {
		return 1 << 62
	}
	p.refillLocked(now)
	if p.tokens < 4096 {
		p.waited, p.owed = true, true
		return 0
	}
	return int64(p.tokens + p.rate*max(span-paceBurst, 0).Seconds())
}

// held remembers, for the controller, that a start was cut short by the
// pace (room gave less than it wanted).
func (p *pacer) held() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.rate > 0 {
		p.cut = true
	}
}

// take charges n bytes started under writeback at now.
func (p *pacer) take(now time.Duration, n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.rate <= 0 {
		return
	}
	p.refillLocked(now)
	p.tokens -= float64(n)
	p.owed = false
}

// period reports whether flusherd was held by the pace in the period
// since the last call (a start was refused and the bucket was never full,
// or a start was cut short: held), and starts the next.
func (p *pacer) period(now time.Duration) (limited bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.rate <= 0 {
		return false
	}
	p.refillLocked(now)
	limited = p.waited && !p.full || p.cut
	p.full, p.waited, p.cut = false, false, false
	return limited
}

// setRate sets the pace (bytes/s; 0: none) from now on.
func (p *pacer) setRate(now time.Duration, rate float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refillLocked(now)
	if rate > 0 && p.rate <= 0 {
		p.tokens, p.last = max(rate*paceBurst.Seconds(), windowFloor), now
	}
	p.rate = rate
}

// Rate is the pace in bytes/s, 0: none.
func (p *pacer) Rate() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rate
}

// paceControl sets the pace from what the device delivers, modelled on
// BBR's bottleneck-bandwidth estimate and pacing gain (and on blk-wbt's
// aim that another program's write finds the queue short):
//
//   - the device is the limit in a period in which the window held
//     flusherd back (its writeback waits in the device's queue) and either
//     the pace did not, or the device wrote less than paceShort × the pace
//     (it could not keep up with it);
//   - no estimate yet: the pace starts at paceStart and doubles after each
//     bandwidth period in which it, and not the window, held flusherd back
//     (TCP's slow start); once the device has been the limit for
//     paceLearn in a row, the device's rate over those periods is the
//     estimate (one period's rate is a noisy sample: a throttle's slices,
//     a disk's cache);
//   - then the pace is paceGain × the estimate, at least paceMin;
//   - periods in which the device was the limit are averaged; after
//     paceJudge of them in a row, the device's rate over them is the new
//     estimate;
//   - every paceProbeEvery of writeback held by the pace, a probe: a
//     period at paceProbeGain × the estimate. If the device kept up, its
//     rate is the estimate and the next period probes again from there,
//     until the window holds flusherd back (a device that became faster is
//     found in a few periods); that period's rate is the estimate.
//
// The device's goroutine owns it.
type paceControl struct {
	est float64 // the device's write rate, bytes/s; 0: not known
	ss  float64 // the slow start's pace while est is not known (0: paceStart)
	// The periods in a row in which the window held flusherd back: their
	// length and the bytes the device wrote in them.
	avgT time.Duration
	avgB float64
	// paced: time held by the pace since the last probe; probe: the
	// current period is a probe.
	paced time.Duration
	probe bool
}

// pace is the pace for the estimate (bytes/s; 0: none).
func (c *paceControl) pace() float64 {
	switch {
	case c.est <= 0:
		return max(c.ss, paceStart)
	case c.probe:
		return max(paceProbeGain*c.est, paceMin)
	}
	return max(paceGain*c.est, paceMin)
}

// update takes a bandwidth period, elapsed long, the device's write rate
// over it (rate, bytes/s; 0: nothing written), whether flusherd waited
// for room under the window in it (windowLimited) and whether the pace
// held it back throughout (paceLimited); it returns the pace for the next
// period (bytes/s; 0: none).
func (c *paceControl) update(elapsed time.Duration, rate uint64, windowLimited, paceLimited bool) float64 {
	r := float64(rate)
	short := windowLimited && rate > 0 && r < paceShort*c.pace()
	device := windowLimited && rate > 0 && (!paceLimited || short)
	switch {
	case c.est <= 0:
		switch {
		case device:
			c.avgT += elapsed
			c.avgB += r * elapsed.Seconds()
			if c.avgT >= paceLearn {
				c.est = c.avgB / c.avgT.Seconds()
				c.avgT, c.avgB = 0, 0
			}
		case paceLimited && !windowLimited:
			c.ss = 2 * c.pace()
			fallthrough
		default:
			c.avgT, c.avgB = 0, 0
		}
	case c.probe:
		c.paced, c.avgT, c.avgB = 0, 0, 0
		switch {
		case paceLimited && !windowLimited:
			// The device kept up with the probe: probe again from there.
			c.est = max(c.est, r)
		case windowLimited || paceLimited:
			c.est = max(c.est, r)
			c.probe = false
		default:
			c.probe = false
		}
	case device:
		c.avgT += elapsed
		c.avgB += r * elapsed.Seconds()
		if c.avgT >= paceJudge {
			c.est = max(c.avgB/c.avgT.Seconds(), paceMin/paceGain)
			c.avgT, c.avgB = 0, 0
		}
	default:
		c.avgT, c.avgB = 0, 0
		if paceLimited {
			c.paced += elapsed
			if c.paced >= paceProbeEvery {
				c.probe = true
			}
		}
	}
	return c.pace()
}

// reset forgets the estimate (target_latency turned off).
func (c *paceControl) reset() { *c = paceControl{} }
