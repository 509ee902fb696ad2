package bdi

import (
	"go.uber.org/zap"
)

// SetConfig replaces the device's tunables (a configuration reload). The
// goroutine takes them at its next round of work; a pass in progress ends
// with the old ones.
func (wb *Writeback) SetConfig(cfg Config) {
	wb.mu.Lock()
	wb.newCfg = &cfg
	wb.mu.Unlock()
	wb.live.kick()
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
		wb.window.set(cfg.TargetLatency, cfg.MaxInflight)
		if cfg.TargetLatency > 0 {
			wb.pace.setRate(wb.now(), wb.paceCtl.pace())
		} else {
			wb.paceCtl.reset()
			wb.pace.setRate(wb.now(), 0)
		}
		chunk := zap.Int64("write_chunk", cfg.WriteChunk)
		if cfg.WriteChunkAuto {
			chunk = zap.String("write_chunk", "auto")
		}
		wb.log.Info("configuration applied", zap.Stringer("dirty_writeback_interval", cfg.DirtyWritebackInterval),
			zap.Stringer("min_pause", cfg.MinPause), zap.Stringer("max_pause", cfg.MaxPause), chunk,
			zap.Int64("max_inflight_bytes", cfg.MaxInflight), zap.Stringer("target_latency", cfg.TargetLatency), zap.Int64("dirty_background_bytes", cfg.DirtyBackgroundBytes),
			zap.Int("dirty_background_ratio", cfg.DirtyBackgroundRatio), zap.Int64("range_bytes", cfg.RangeBytes))
	}
}
