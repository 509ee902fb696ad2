package config

import (
	"bytes"
	"io"

	"github.com/BurntSushi/toml"
)

// Encode writes c as TOML that Parse reads back to an equal Config: all
// keys are written, durations as strings like "5s" and sizes like "4MiB".
func (c *Config) Encode(w io.Writer) error {
	wb := c.Writeback
	e := encConfig{
		Writeback: encWriteback{
			DirtyWritebackInterval: wb.DirtyWritebackInterval.String(),
			DirtyExpireInterval:    wb.DirtyExpireInterval.String(),
			MinPause:               wb.MinPause.String(),
			MaxPause:               wb.MaxPause.String(),
			WriteChunk:             formatSize(wb.WriteChunk),
			DirtyBackgroundBytes:   formatSize(wb.DirtyBackgroundBytes),
			DirtyBackgroundRatio:   wb.DirtyBackgroundRatio,
			RangeBytes:             formatSize(wb.RangeBytes),
			RequeueBlocked:         wb.RequeueBlocked,
			AttemptTimeout:         wb.AttemptTimeout.String(),
			ShutdownTimeout:        wb.ShutdownTimeout.String(),
			TargetLatency:          wb.TargetLatency.String(),
			MaxTrackedInodes:       wb.MaxTrackedInodes,
		},
		Plug:    encPlug{c.Plug.Enabled, c.Plug.MaxPending, c.Plug.QueueDepth, c.Plug.IntegritySyncfs, formatSize(c.Plug.MaxInflightBytes)},
		Watcher: encWatcher{Backend: c.Watcher.Backend, RescanInterval: c.Watcher.RescanInterval.String(), SweepInterval: c.Watcher.SweepText()},
		Stats:   encStats(c.Stats),
		Log:     encLog(c.Log),
		Metrics: encMetrics(c.Metrics),
	}
	if wb.WriteChunkAuto {
		e.Writeback.WriteChunk = "auto"
	}

	switch wb.MaxTrackedInodes {
	case MaxTrackedAuto:
		e.Writeback.MaxTrackedInodes = "auto"
	case MaxTrackedUnlimited:
		e.Writeback.MaxTrackedInodes = "unlimited"
	}
	for _, x := range c.Watch {
		e.Watch = append(e.Watch, encWatch{Path: x.Root, Recursive: x.Recursive, Mode: string(x.Mode), Expire: x.Expire.String()})
	}
	var buf bytes.Buffer
	enc := toml.NewEncoder(&buf)
	enc.Indent = ""
	if err := enc.Encode(e); err != nil {
		return err
	}
	_, err := w.Write(buf.Bytes())
	return err
}

type encConfig struct {
	Writeback encWriteback `toml:"writeback"`
	Plug      encPlug      `toml:"plug"`
	Watcher   encWatcher   `toml:"watcher"`
	Stats     encStats     `toml:"stats"`
	Log       encLog       `toml:"log"`
	Metrics   encMetrics   `toml:"metrics"`
	Watch     []encWatch   `toml:"watch,omitempty"`
}

type encWriteback struct {
	DirtyWritebackInterval string `toml:"dirty_writeback_interval"`
	DirtyExpireInterval    string `toml:"dirty_expire_interval"`
	MinPause               string `toml:"min_pause"`
	MaxPause               string `toml:"max_pause"`
	WriteChunk             string `toml:"write_chunk"`
	DirtyBackgroundBytes   string `toml:"dirty_background_bytes"`
	DirtyBackgroundRatio   int    `toml:"dirty_background_ratio"`
	RangeBytes             string `toml:"range_bytes"`
	RequeueBlocked         string `toml:"requeue_blocked"`
	AttemptTimeout         string `toml:"attempt_timeout"`
	ShutdownTimeout        string `toml:"shutdown_timeout"`
	TargetLatency          string `toml:"target_latency"`
	MaxTrackedInodes       any    `toml:"max_tracked_inodes"` // "auto", "unlimited" or an int64
}

type encPlug struct {
	Enabled          bool   `toml:"enabled"`
	MaxPending       int    `toml:"max_pending"`
	QueueDepth       int    `toml:"queue_depth"`
	IntegritySyncfs  int    `toml:"integrity_syncfs"`
	MaxInflightBytes string `toml:"max_inflight_bytes"`
}

type encWatcher struct {
	Backend        string `toml:"backend"`
	RescanInterval string `toml:"rescan_interval"`
	SweepInterval  string `toml:"sweep_interval"`
}

type encStats struct {
	Dir string `toml:"dir"`
}

type encLog struct {
	Level  string `toml:"level"`
	Format string `toml:"format"`
}

type encMetrics struct {
	Listen string `toml:"listen"`
}

type encWatch struct {
	Path      string `toml:"path"`
	Recursive bool   `toml:"recursive"`
	Mode      string `toml:"mode"`
	Expire    string `toml:"expire"`
}
