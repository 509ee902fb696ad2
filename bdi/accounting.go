package bdi

import "flusherd/policy"

// counters is a device's accounting: the single source of the figures that
// the stats file, the metrics, `flusherd dirty` and the shutdown lines
// show. A Writeback's list lock guards it; Snapshot copies it whole.
// Pages are in pages.
type counters struct {
	// dirtySum and wbSum are the sums of the tracked inodes' DirtyPages
	// and WritebackPages (setPagesLocked keeps them): BdiReclaimable and
	// BdiWriteback, and what the background threshold is checked against.
	dirtySum, wbSum uint64
	// dirtied counts pages seen newly dirty (BdiDirtied): at each look at
	// an inode, the growth of its dirty count since the last.
	dirtied uint64
	written uint64 // pages written back (BdiWritten)
	// throttled counts attempts deferred by max_inflight; errors failed
	// attempts (writeback_errors); gone inodes dropped because their
	// file went away; rescans tree rescans (Registry.Rescanned);
	// detached writeback calls detached (detachAfter).
	throttled, errors, gone, rescans, detached uint64
	backgroundWorks, rangeWritebacks           uint64
	outcomes                                   [policy.NumOutcomes]uint64 // attempts by outcome
	plug                                       [3]uint64                  // the plug's requests, merges, batches, published after each work
	stuck                                      int                        // calls past attempt_timeout that have not returned
	failed                                     int                        // inodes on bFailed
}
