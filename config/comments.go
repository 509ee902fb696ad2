package config

import (
	"bytes"
	"fmt"
	"io"
	"strings"

	"flusherd/tree"
)

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
	"writeback.attempt_timeout":          "a writeback call longer than this counts as blocked (at least 10ms)",
	"writeback.shutdown_timeout":         "bound on the final writeback at SIGTERM",
	"writeback.target_latency":           `writeback in flight sized so another write waits about this, and paced below the device's rate ("0": max_inflight_bytes, no pace)`,
	"writeback.max_tracked_inodes":       `files tracked at once; past it, syncfs passes ("auto": from the memory limit; "unlimited")`,
	"plug.enabled":                       "batch, sort and merge writeback requests",
	"plug.max_pending":                   "requests held before a forced flush",
	"plug.queue_depth":                   "requests in flight during a flush",
	"plug.integrity_syncfs":              "integrity batches this large use one syncfs(2) (0: never)",
	"plug.max_inflight_bytes":            "writeback in flight per device before big files wait",
	"watcher.backend":                    `"fanotify" (root), "inotify", or "auto"`,
	"watcher.rescan_interval":            "rescans of directories inotify could not watch",
	"watcher.sweep_interval":             `open and mapped files looked at for writes without events ("auto": expire/2; "0": off)`,
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

// follows are the keys whose default follows another key's value, with
// what they follow as the printed files say it.
var follows = map[string]string{
	"writeback.max_pause":     "as dirty_writeback_interval",
	"plug.max_inflight_bytes": "16MiB, or write_chunk when that is larger",
	"watch.expire":            "as [writeback] dirty_expire_interval",
}

// WriteDefault writes the built-in defaults as a configuration file that
// Load accepts unchanged, each key with its comment (KeyComment): its one
// [[watch]] is /var/log, which every Linux system has. The keys whose
// default follows another key (follows) are written commented out, so
// that changing the key they follow changes them too.
func WriteDefault(w io.Writer) error {
	cfg := Default()
	cfg.Watch = []Watch{{Tree: tree.Tree{Root: "/var/log", Recursive: true, Mode: tree.ModeWriteback, Expire: cfg.Writeback.DirtyExpireInterval}}}
	var buf bytes.Buffer
	if err := cfg.Encode(&buf); err != nil {
		return err
	}
	head := "# flusherd's built-in defaults, with one [[watch]] entry as an example (the\n# defaults watch nothing): replace it with your trees. Durations need a\n# unit (\"500ms\", \"5s\"); sizes take B, KiB, MiB or GiB. Commented keys\n# follow another key unless set.\n"
	_, err := io.WriteString(w, head+annotate(buf.String(), true, func(string) bool { return false }))
	return err
}

// EncodeEffective is Encode for showing a loaded configuration
// (check-config): the keys whose default follows another key (follows)
// and that the files did not set are written commented out, with their
// effective value, so that the output saved as a file does not pin them.
func (c *Config) EncodeEffective(w io.Writer) error {
	var buf bytes.Buffer
	if err := c.Encode(&buf); err != nil {
		return err
	}
	set := func(key string) bool {
		if key == "plug.max_inflight_bytes" {
			key = c.src.inflightKey()
		}
		return c.src.line(key) > 0
	}
	_, err := io.WriteString(w, annotate(buf.String(), false, set))
	return err
}

// annotate rewrites Encode's output: with describe, each key gets its
// comment (KeyComment); a key in follows that set does not report is
// written commented out under a line saying what it follows. set takes
// the key as a source numbers it ("watch[1].expire").
func annotate(encoded string, describe bool, set func(key string) bool) string {
	var out strings.Builder
	table, watches := "", -1
	for _, line := range strings.SplitAfter(encoded, "\n") {
		switch t := strings.TrimSpace(line); {
		case strings.HasPrefix(t, "["):
			table = strings.Trim(t, "[]")
			if table == "watch" {
				watches++
			}
		case strings.Contains(t, " = "):
			key, _, _ := strings.Cut(t, " = ")
			dotted := table + "." + key
			if c := KeyComment(dotted); describe && c != "" {
				line = fmt.Sprintf("%-36s # %s\n", t, c)
			}
			numbered := dotted
			if table == "watch" {
				numbered = fmt.Sprintf("watch[%d].%s", watches, key)
			}
			if f, ok := follows[dotted]; ok && !set(numbered) {
				fmt.Fprintf(&out, "# default: %s\n# %s", f, line)
				continue
			}
		}
		out.WriteString(line)
	}
	return out.String()
}
