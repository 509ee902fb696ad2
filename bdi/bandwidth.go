package bdi

import (
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"flusherd/policy"
)

// bandwidthInterval is the shortest period the write bandwidth is measured
// over (the kernel's BANDWIDTH_INTERVAL is 200ms), and bandwidthPeriod the
// smoothing period (roundup_pow_of_two(3 * HZ) jiffies at HZ=1000).
const (
	bandwidthInterval = 200 * time.Millisecond
	bandwidthPeriod   = 4096 * time.Millisecond
)

// bandwidth is a device's write bandwidth estimator, the kernel's
// wb->write_bandwidth and avg_write_bandwidth with their stamps. The
// device's goroutine owns it and alone calls update; the figures are read
// anywhere (atomics).
type bandwidth struct {
	kBps, avgKBps atomic.Uint64 // write_bandwidth, avg_write_bandwidth (kB/s)
	// diskWritten reads the device's completed writes in bytes
	// (/sys/dev/block/<bdi>/stat); nil: not a block device.
	diskWritten func() (uint64, error)
	// The written count and daemon time at the last update; started: the
	// stamp is set; idle: nothing was written in the period before it.
	stamp         time.Duration
	written       uint64
	started, idle bool
	// inst is the rate of the last period measured (bytes/s), before
	// smoothing; 0 after a period that was not (idle, or too long).
	inst uint64
	// elapsed is the last period's length.
	elapsed time.Duration
}

// update is __wb_update_bandwidth and wb_update_write_bandwidth: every
// bandwidthInterval or more while the device has dirty io (has), the
// bytes written since the last update, over the time since, are folded
// into write_bandwidth (BdiWriteBandwidth) with weight elapsed/period, and
// that into avg_write_bandwidth (auto write_chunk) with the kernel's extra
// smoothing. What is written is the device's completed writes
// (diskWritten) for a block device; for another bdi (FUSE, NFS, btrfs),
// flusherdWritten, the bytes flusherd's attempts wrote back. A period in
// which nothing was written is not counted, nor a long one that began so
// (the kernel skips such a period too): a file waiting on b_dirty does not
// wear the figure down to 0. It reports whether a period ended (a new
// stamp: inst is that period's rate, or 0).
func (b *bandwidth) update(now time.Duration, has bool, flusherdWritten uint64, log *zap.Logger) (period bool) {
	written := flusherdWritten
	if b.diskWritten != nil {
		if n, err := b.diskWritten(); err == nil {
			written = n
		} else if policy.Shortage(err) {
			// Out of descriptors or memory for a moment: this update
			// is skipped, the stat file read again at the next.
			return false
		} else {
			b.diskWritten = nil // not a block device: no stat file to read
			log.Info("no block device statistics for this device: its write bandwidth (BdiWriteBandwidth, write_chunk = \"auto\") is measured from flusherd's own writeback", zap.Error(err))
			b.started = false
		}
	}
	elapsed := now - b.stamp
	idle := written == b.written
	switch {
	case !b.started:
		b.started = true
	case elapsed < bandwidthInterval:
		return false
	case idle, elapsed > time.Second && b.idle, !has && elapsed > time.Second:
		// Nothing written since the last stamp, or a period that
		// began idle and ran long (the kernel skips such a period:
		// its writes began somewhere in it): a new stamp, no rate. A
		// device that writes nothing has no bandwidth to measure,
		// not one of 0.
		b.inst = 0
	default:
		b.inst = (written - min(written, b.written)) * uint64(time.Second) / uint64(elapsed)
		bw, avg := writeBandwidth(b.kBps.Load(), b.avgKBps.Load(), written-min(written, b.written), elapsed)
		b.kBps.Store(bw)
		b.avgKBps.Store(avg)
	}
	b.stamp, b.written, b.idle, b.elapsed = now, written, idle, elapsed
	return true
}

// writeBandwidth is wb_update_write_bandwidth's arithmetic: given the
// old write_bandwidth and avg_write_bandwidth (kB/s) and the bytes
// written over elapsed, it returns the new ones.
func writeBandwidth(old, avg, written uint64, elapsed time.Duration) (bw, newAvg uint64) {
	rate := written * uint64(time.Second) / uint64(elapsed) / 1024 // kB/s
	if elapsed > bandwidthPeriod || (old == 0 && avg == 0) {
		// A period's worth, or the first figure (the kernel starts
		// from a guess, INIT_BW; flusherd from its first measurement).
		return rate, rate
	}
	bw = (rate*uint64(elapsed) + old*uint64(bandwidthPeriod-elapsed)) / uint64(bandwidthPeriod)
	newAvg = avg
	if newAvg > old && old >= bw {
		newAvg -= (newAvg - old) >> 3
	}
	if newAvg < old && old <= bw {
		newAvg += (old - newAvg) >> 3
	}
	return bw, newAvg
}
