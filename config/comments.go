package config

// keyComments are one-line descriptions of the keys, by dotted key (a
// [[watch]] entry's keys under "watch"), for print-default-config; the
// reference is flusherd.toml(5).
var keyComments = map[string]string{
	"writeback.dirty_writeback_interval": "kupdate period (the kernel: 5s)",
	"writeback.dirty_expire_interval":    "age at which dirty data is written back (the kernel: 30s)",
	"writeback.min_pause":                "first backoff pause for blocked files",
	"writeback.max_pause":                "longest backoff pause for blocked files",
	"writeback.write_chunk":              `most written back per file per attempt; "auto": from the bandwidth`,
	"writeback.dirty_background_bytes":   `per device: write the oldest files first while over it ("0": off)`,
	"writeback.dirty_background_ratio":   "the same, as a percentage of the kernel's background threshold (0: off)",
	"writeback.range_bytes":              `streaming files: write back what lies behind their last range_bytes ("0": off)`,
	"writeback.requeue_blocked":          `"io_wait" (retry with backoff) or "redirty_tail" (legacy)`,
	"writeback.attempt_timeout":          "a writeback call longer than this counts as blocked (0: no bound)",
	"writeback.shutdown_timeout":         "bound on the final writeback at SIGTERM",
	"plug.enabled":                       "batch, sort and merge writeback requests",
	"plug.max_pending":                   "requests held before a forced flush",
	"plug.queue_depth":                   "requests in flight during a flush",
	"plug.integrity_syncfs":              "integrity batches this large use one syncfs(2) (0: never)",
	"plug.max_inflight_bytes":            "writeback in flight per device before big files wait",
	"watcher.backend":                    `"fanotify" (root), "inotify", or "auto"`,
	"watcher.rescan_interval":            "rescans of directories inotify could not watch",
	"stats.dir":                          "<dir>/bdi/<dev>/stats and <dir>/flusherd.sock",
	"log.level":                          `"debug", "info", "warn" or "error"`,
	"log.format":                         `"console" or "json" (one JSON object a line); read at start only`,
	"metrics.listen":                     `host:port of the Prometheus /metrics endpoint ("": off)`,
	"watch.path":                         "the directory tree",
	"watch.recursive":                    "the whole tree below path",
	"watch.mode":                         `"writeback", or "integrity": fdatasync, durable within the bound`,
	"watch.expire":                       "this tree's dirty_expire_interval",
}

// KeyComment returns a one-line description of the dotted key (a
// [[watch]] entry's keys as "watch.path"), "" for an unknown key.
func KeyComment(key string) string { return keyComments[key] }
