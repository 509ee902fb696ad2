package bdi

import (
	"slices"
	"time"
)

// ExposureBuckets are the upper bounds, in seconds, of the exposure
// histogram's buckets (the last bucket, +Inf, holds the rest).
var ExposureBuckets = [...]float64{0.1, 0.25, 0.5, 1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 45, 60, 90, 120, 300, 600, 1800, 3600}

// exposureWindow is how far back Exposure.Recent looks, in minutes.
const exposureWindow = 10

// exposure is a histogram of how long data stayed dirty before flusherd
// began writing it: from a file's dirtiedWhen to its first attempt that
// wrote since. It keeps the counts since the start (for Prometheus) and
// per minute for the last exposureWindow minutes (for the quantiles that
// status shows). The list lock guards it.
type exposure struct {
	counts [len(ExposureBuckets) + 1]uint64 // per bucket of ExposureBuckets, +Inf last (cumulated by Exposure)
	sum    time.Duration
	n      uint64
	recent [exposureWindow]exposureMinute
}

// exposureMinute is one minute's observations.
type exposureMinute struct {
	minute int64 // minutes on the daemon clock; the slot is stale if older than the window
	counts [len(ExposureBuckets) + 1]uint32
	n      uint32
	max    time.Duration
}

func bucketOf(d time.Duration) int {
	s := d.Seconds()
	i, _ := slices.BinarySearch(ExposureBuckets[:], s)
	return i
}

// observe records d (an exposure) at now (daemon clock).
func (e *exposure) observe(d, now time.Duration) {
	d = max(d, 0)
	b := bucketOf(d)
	e.counts[b]++
	e.sum += d
	e.n++
	m := int64(now / time.Minute)
	slot := &e.recent[m%exposureWindow]
	if slot.minute != m || slot.n == 0 {
		*slot = exposureMinute{minute: m}
	}
	slot.counts[b]++
	slot.n++
	slot.max = max(slot.max, d)
}

// Exposure is a tree's exposure figures (see exposure).
type Exposure struct {
	// Buckets are the cumulative counts at each bound of
	// ExposureBuckets; Count and Sum (seconds) are all observations'.
	Buckets []uint64
	Count   uint64
	Sum     float64
	// Recent: the observations of the last exposureWindow minutes:
	// their number, the p50 and p99 (the upper bound of the bucket that
	// holds the quantile, at most Max) and the largest, in seconds.
	RecentCount         uint64
	P50, P99, MaxRecent float64
}

// figures returns e's figures at now (daemon clock).
func (e *exposure) figures(now time.Duration) Exposure {
	out := Exposure{Buckets: make([]uint64, len(ExposureBuckets)), Count: e.n, Sum: e.sum.Seconds()}
	var cum uint64
	for i := range ExposureBuckets {
		cum += e.counts[i]
		out.Buckets[i] = cum
	}
	var recent [len(ExposureBuckets) + 1]uint64
	var maxD time.Duration
	m := int64(now / time.Minute)
	for _, s := range e.recent {
		if s.n == 0 || s.minute <= m-exposureWindow || s.minute > m {
			continue
		}
		for i, c := range s.counts {
			recent[i] += uint64(c)
		}
		out.RecentCount += uint64(s.n)
		maxD = max(maxD, s.max)
	}
	out.MaxRecent = maxD.Seconds()
	quantile := func(q float64) float64 {
		want := uint64(q*float64(out.RecentCount) + 0.999999)
		var c uint64
		for i, n := range recent {
			c += n
			if c >= want {
				if i < len(ExposureBuckets) {
					return min(ExposureBuckets[i], out.MaxRecent)
				}
				return out.MaxRecent
			}
		}
		return out.MaxRecent
	}
	if out.RecentCount > 0 {
		out.P50, out.P99 = quantile(0.5), quantile(0.99)
	}
	return out
}

// add adds o's observations to e (another device's of the same tree, on
// the same clock).
func (e *exposure) add(o *exposure) {
	for i := range e.counts {
		e.counts[i] += o.counts[i]
	}
	e.sum += o.sum
	e.n += o.n
	for i := range e.recent {
		mine, theirs := &e.recent[i], &o.recent[i]
		switch {
		case theirs.n == 0:
		case mine.n == 0 || theirs.minute > mine.minute:
			*mine = *theirs
		case theirs.minute == mine.minute:
			for j := range mine.counts {
				mine.counts[j] += theirs.counts[j]
			}
			mine.n += theirs.n
			mine.max = max(mine.max, theirs.max)
		}
	}
}
