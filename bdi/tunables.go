package bdi

import (
	"time"

	"go.uber.org/zap"

	"flusherd/policy"
)

// Config holds a device's tunables. Durations are time.Duration
// (nanoseconds); WriteChunk is in bytes.
type Config struct {
	DirtyWritebackInterval time.Duration // kupdate period
	MinPause, MaxPause     time.Duration // b_more_io_wait backoff
	WriteChunk             int64         // most bytes written per inode per attempt
	// WriteChunkAuto: the chunk follows the device's write bandwidth
	// (writeChunk), WriteChunk is ignored.
	WriteChunkAuto bool
	MaxInflight    int64 // bytes under writeback on the device before big files, ranges and background work wait; 0: no bound
	// DirtyBackgroundBytes and DirtyBackgroundRatio (a percentage of the
	// kernel's nr_dirty_background_threshold) set the device's background
	// threshold (the lower one when both are set); 0: off.
	DirtyBackgroundBytes int64
	DirtyBackgroundRatio int
	// RangeBytes is the hot tail of a streaming file left to its writer;
	// what lies behind it is written back once the file has grown by
	// 2 × RangeBytes past the last range writeback. 0: off.
	RangeBytes  int64
	Requeue     policy.RequeueBlocked
	PlugEnabled bool
	MaxPending  int // plug requests before a forced flush
	QueueDepth  int // requests in flight during a flush
	// IntegritySyncfs: a batch holding at least this many integrity
	// requests for one filesystem makes them durable with one syncfs(2)
	// (sync_inodes_sb plus sync_fs, as the kernel's syncfs does) instead
	// of an fdatasync each; 0: never.
	IntegritySyncfs int
	// AttemptTimeout bounds one writeback system call; one that takes
	// longer counts as blocked (ETIMEDOUT) and its inode stays Busy until
	// the call returns. 0: no bound.
	AttemptTimeout time.Duration
}

// Tree is what a watched tree contributes to its inodes.
type Tree struct {
	Expire    time.Duration // dirty_expire_interval for its inodes
	Integrity bool          // fdatasync instead of sync_file_range
}

// SetConfig replaces the device's tunables (a configuration reload). The
// goroutine takes them at its next round of work; a pass in progress ends
// with the old ones.
func (wb *Writeback) SetConfig(cfg Config) {
	wb.mu.Lock()
	wb.newCfg = &cfg
	wb.mu.Unlock()
	wb.kick()
}

// applyConfig installs a pending SetConfig; called by the goroutine
// between rounds, when no request is in flight.
func (wb *Writeback) applyConfig() {
	wb.mu.Lock()
	cfg := wb.newCfg
	wb.newCfg = nil
	if cfg != nil {
		wb.cfg = *cfg
		wb.loop.backoff.Min, wb.loop.backoff.Max = cfg.MinPause, cfg.MaxPause
		if wb.loop.backoff.Pause > cfg.MaxPause {
			wb.loop.backoff.Pause = cfg.MaxPause
		}
	}
	wb.mu.Unlock()
	if cfg != nil {
		wb.plug.Enabled, wb.plug.MaxPending = cfg.PlugEnabled, cfg.MaxPending
		chunk := zap.Int64("write_chunk", cfg.WriteChunk)
		if cfg.WriteChunkAuto {
			chunk = zap.String("write_chunk", "auto")
		}
		wb.log.Info("configuration applied", zap.Stringer("dirty_writeback_interval", cfg.DirtyWritebackInterval),
			zap.Stringer("min_pause", cfg.MinPause), zap.Stringer("max_pause", cfg.MaxPause), chunk,
			zap.Int64("max_inflight_bytes", cfg.MaxInflight), zap.Int64("dirty_background_bytes", cfg.DirtyBackgroundBytes),
			zap.Int("dirty_background_ratio", cfg.DirtyBackgroundRatio), zap.Int64("range_bytes", cfg.RangeBytes))
	}
}
