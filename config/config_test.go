package config

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"flusherd/tree"
)

// ignoreSrc ignores the unexported position information in Config.
var ignoreSrc = cmpopts.IgnoreUnexported(Config{})

func TestDefault(t *testing.T) {
	want := &Config{
		Writeback: Writeback{
			DirtyWritebackInterval: time.Second,
			DirtyExpireInterval:    5 * time.Second,
			MinPause:               10 * time.Millisecond,
			MaxPause:               time.Second,
			WriteChunk:             4 << 20,
			RangeBytes:             1 << 20,
			RequeueBlocked:         RequeueIOWait,
			AttemptTimeout:         10 * time.Second,
			ShutdownTimeout:        30 * time.Second,
			TargetLatency:          25 * time.Millisecond,
		},
		Plug:    Plug{Enabled: true, MaxPending: 256, QueueDepth: 8, IntegritySyncfs: 64, MaxInflightBytes: 16 << 20},
		Watcher: Watcher{Backend: BackendAuto, RescanInterval: 30 * time.Second, SweepAuto: true},
		Stats:   Stats{Dir: "/run/flusherd"},
		Log:     Log{Level: "info", Format: "console"},
	}
	if diff := cmp.Diff(want, Default(), ignoreSrc); diff != "" {
		t.Errorf("Default() mismatch (-want +got):\n%s", diff)
	}
	// Parsing an empty file gives the defaults.
	got, err := Parse("empty.toml", nil)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got, ignoreSrc); diff != "" {
		t.Errorf("Parse(empty) mismatch (-want +got):\n%s", diff)
	}
	// The defaults, which watch nothing, are valid.
	if err := Default().Validate(); err != nil {
		t.Errorf("Default().Validate() = %v, want nil", err)
	}
}

func TestParse(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	tests := []struct {
		name string
		src  string
		want func(c *Config) // applied to Default()
	}{
		{
			name: "full",
			src: `
[writeback]
dirty_writeback_interval = "2s"
dirty_expire_interval = "1m"
min_pause = "5ms"
max_pause = "1s"
write_chunk = "8MiB"
dirty_background_bytes = "64MiB"
dirty_background_ratio = 25
range_bytes = "2MiB"
requeue_blocked = "redirty_tail"
attempt_timeout = "1500ms"
shutdown_timeout = "1m30s"
target_latency = "40ms"

[plug]
enabled = false
max_pending = 64
queue_depth = 4
max_inflight_bytes = "32MiB"

[stats]
dir = "/var/lib/flusherd"

[log]
level = "debug"
format = "json"

[metrics]
listen = "127.0.0.1:9469"

[[watch]]
path = "/srv/data/"
recursive = false
mode = "integrity"
expire = "10s"

[[watch]]
path = "rel/../tree"
`,
			want: func(c *Config) {
				c.Writeback = Writeback{
					DirtyWritebackInterval: 2 * time.Second,
					DirtyExpireInterval:    time.Minute,
					MinPause:               5 * time.Millisecond,
					MaxPause:               time.Second,
					WriteChunk:             8 << 20,
					DirtyBackgroundBytes:   64 << 20,
					DirtyBackgroundRatio:   25,
					RangeBytes:             2 << 20,
					RequeueBlocked:         RequeueRedirtyTail,
					AttemptTimeout:         1500 * time.Millisecond,
					ShutdownTimeout:        90 * time.Second,
					TargetLatency:          40 * time.Millisecond,
				}
				c.Plug = Plug{Enabled: false, MaxPending: 64, QueueDepth: 4, IntegritySyncfs: 64, MaxInflightBytes: 32 << 20}
				c.Stats.Dir = "/var/lib/flusherd"
				c.Log.Level = "debug"
				c.Log.Format = "json"
				c.Metrics.Listen = "127.0.0.1:9469"
				c.Watch = []Watch{
					{Tree: tree.Tree{Root: "/srv/data", Recursive: false, Mode: tree.ModeIntegrity, Expire: 10 * time.Second}},
					{Tree: tree.Tree{Root: filepath.Join(dir, "tree"), Recursive: true, Mode: tree.ModeWriteback, Expire: time.Minute}},
				}
			},
		},
		{
			name: "max_pause follows dirty_writeback_interval",
			src:  "[writeback]\ndirty_writeback_interval = \"3s\"\n",
			want: func(c *Config) {
				c.Writeback.DirtyWritebackInterval = 3 * time.Second
				c.Writeback.MaxPause = 3 * time.Second
			},
		},
		{
			name: "watch expire follows dirty_expire_interval",
			src:  "[writeback]\ndirty_expire_interval = \"45s\"\n[[watch]]\npath = \"/a\"\n",
			want: func(c *Config) {
				c.Writeback.DirtyExpireInterval = 45 * time.Second
				c.Watch = []Watch{{Tree: tree.Tree{Root: "/a", Recursive: true, Mode: tree.ModeWriteback, Expire: 45 * time.Second}}}
			},
		},
		{
			name: "relative paths are from the working directory",
			src:  "[stats]\ndir = \"run\"\n[[watch]]\npath = \"data/\"\n",
			want: func(c *Config) {
				c.Stats.Dir = filepath.Join(dir, "run")
				c.Watch = []Watch{{Tree: tree.Tree{Root: filepath.Join(dir, "data"), Recursive: true, Mode: tree.ModeWriteback, Expire: c.Writeback.DirtyExpireInterval}}}
			},
		},
		{
			name: "metrics on every address",
			src:  "metrics.listen = \":9469\"\n",
			want: func(c *Config) { c.Metrics.Listen = ":9469" },
		},
		{
			name: "metrics on IPv6 loopback",
			src:  "[metrics]\nlisten = \"[::1]:65535\"\n",
			want: func(c *Config) { c.Metrics.Listen = "[::1]:65535" },
		},
		{
			name: "metrics on a host name",
			src:  "[metrics]\nlisten = \"localhost:1\"\n",
			want: func(c *Config) { c.Metrics.Listen = "localhost:1" },
		},
		{
			name: "metrics off",
			src:  "[metrics]\nlisten = \"\"\n",
			want: func(c *Config) {},
		},
		{
			name: "sizes",
			src:  "[writeback]\nwrite_chunk = 65536\n",
			want: func(c *Config) { c.Writeback.WriteChunk = 65536 },
		},
		{
			name: "size without unit is bytes",
			src:  "[writeback]\nwrite_chunk = \"8192\"\n",
			want: func(c *Config) { c.Writeback.WriteChunk = 8192 },
		},
		{
			name: "dotted keys, quoted keys, inline tables",
			src: `writeback.min_pause = "1ms"
"log" = { "level" = 'warn' }
watch = [ { path = "/x", mode = "integrity" },
          { path = '/y', recursive = false } ]
`,
			want: func(c *Config) {
				c.Writeback.MinPause = time.Millisecond
				c.Log.Level = "warn"
				c.Watch = []Watch{
					{Tree: tree.Tree{Root: "/x", Recursive: true, Mode: tree.ModeIntegrity, Expire: 5 * time.Second}},
					{Tree: tree.Tree{Root: "/y", Recursive: false, Mode: tree.ModeWriteback, Expire: 5 * time.Second}},
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse("flusherd.toml", []byte(tt.src))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			want := Default()
			tt.want(want)
			if diff := cmp.Diff(want, got, ignoreSrc); diff != "" {
				t.Errorf("Parse mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseExample(t *testing.T) {
	data, err := os.ReadFile("testdata/flusherd.toml")
	if err != nil {
		t.Fatal(err)
	}
	got, err := Parse("testdata/flusherd.toml", data)
	if err != nil {
		t.Fatal(err)
	}
	want := Default()
	want.Watch = []Watch{
		{Tree: tree.Tree{Root: "/srv/data", Recursive: true, Mode: tree.ModeWriteback, Expire: 5 * time.Second}},
		{Tree: tree.Tree{Root: "/srv/db", Recursive: false, Mode: tree.ModeIntegrity, Expire: 5 * time.Second}},
	}
	if diff := cmp.Diff(want, got, ignoreSrc); diff != "" {
		t.Errorf("Parse mismatch (-want +got):\n%s", diff)
	}
}

func asError(t *testing.T, err error) *Error {
	t.Helper()
	if err == nil {
		t.Fatal("got no error")
	}
	e, ok := errors.AsType[*Error](err)
	if !ok {
		t.Fatalf("error %v (%T) is not an *Error", err, err)
	}
	return e
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		src  string
		key  string
		line int
		msg  string // substring of Error()
	}{
		// Syntax.
		{"syntax unterminated string", "[writeback]\n\nmin_pause = \"1s\n", "writeback.min_pause", 3, "strings cannot contain newlines"},
		{"syntax duplicate key", "[log]\nlevel = \"info\"\nlevel = \"warn\"\n", "log.level", 3, "already been defined"},
		{"syntax bad value", "[plug]\nenabled = yes\nmax_pending = 1\n", "plug.enabled", 2, "flusherd.toml:2: plug.enabled: "},
		{"syntax bad header", "[plug]\nenabled = true\n\n[writeback\nmin_pause = \"1s\"\n", "plug", 4, "to end table name"},

		// Unknown keys.
		{"unknown top-level key", "[log]\nlevel = \"info\"\n\nfoo = 1\n", "log.foo", 4, "unknown key"},
		{"unknown top-level table", "\n[logging]\nlevel = \"info\"\n", "logging", 2, "unknown key, want one of log, metrics, plug, stats, watch, watcher, writeback"},
		{"unknown bare top-level key", "verbose = true\n[log]\n", "verbose", 1, "unknown key"},
		{"unknown key in table", "[writeback]\nmin_pause = \"1ms\"\n  min_paus = \"1ms\"\n", "writeback.min_paus", 3, "unknown key, want one of attempt_timeout,"},
		{"unknown quoted key", "[writeback]\n\"min pause\" = \"1ms\"\n", `writeback."min pause"`, 2, "unknown key"},
		{"unknown sub-table", "[writeback]\n[writeback.extra]\nx = 1\n", "writeback.extra", 2, "unknown key"},
		{"unknown key in second watch", "[[watch]]\npath = \"/a\"\n[[watch]]\npath = \"/b\"\nrecurse = false\n", "watch[1].recurse", 5, "unknown key, want one of expire, mode, path, recursive"},
		{"unknown key in inline watch", "watch = [{path = \"/a\"},\n  {path = \"/b\", x = 1}]\n", "watch[1].x", 2, "unknown key"},

		// Durations.
		{"bad duration", "[writeback]\nmin_pause = \"10 msec\"\n", "writeback.min_pause", 2, `bad duration "10 msec": want a number with a unit`},
		{"duration too large", "[writeback]\nshutdown_timeout = \"99999999h\"\n", "writeback.shutdown_timeout", 2, `bad duration "99999999h": too large, at most 2562047h47m16.854775807s`},
		{"bare integer duration", "[writeback]\n\nmax_pause = 5\n", "writeback.max_pause", 3, `bad duration 5: a duration must be a string with a unit, e.g. "5s"`},
		{"float duration", "[writeback]\nattempt_timeout = 1.5\n", "writeback.attempt_timeout", 2, "bad duration 1.5"},
		{"unit-less duration", "[writeback]\ndirty_writeback_interval = \"5s\"\n\nmin_pause = \"10\"\n", "writeback.min_pause", 4, `writeback.min_pause: bad duration "10": a duration needs a unit, e.g. "10s" or "10ms"`},
		{"boolean duration", "[writeback]\nshutdown_timeout = true\n", "writeback.shutdown_timeout", 2, "got boolean true"},
		{"watch expire unit-less", "[[watch]]\npath = \"/a\"\nexpire = \"30\"\n", "watch[0].expire", 3, "needs a unit"},

		// Sizes.
		{"size decimal unit", "[writeback]\nwrite_chunk = \"4MB\"\n", "writeback.write_chunk", 2, `bad size "4MB": ambiguous unit "MB"`},
		{"size garbage", "[writeback]\nwrite_chunk = \"lots\"\n", "writeback.write_chunk", 2, `bad size "lots"`},
		{"size fraction", "[writeback]\nwrite_chunk = \"1.5MiB\"\n", "writeback.write_chunk", 2, `fractions are not allowed`},
		{"size float", "[writeback]\nwrite_chunk = 4096.0\n", "writeback.write_chunk", 2, "got float 4096"},
		{"size overflow", "[writeback]\nwrite_chunk = \"9999999999999GiB\"\n", "writeback.write_chunk", 2, "too large"},
		{"size too small", "[writeback]\nwrite_chunk = \"2KiB\"\n", "writeback.write_chunk", 2, "must be at least 4096 bytes"},
		{"size zero", "[writeback]\nwrite_chunk = 0\n", "writeback.write_chunk", 2, "must be at least 4096 bytes"},
		{"size too large", "[writeback]\nwrite_chunk = 9223372036854775807\n", "writeback.write_chunk", 2, "must be at most 1073741824 bytes (1GiB)"},
		{"size too large in units", "[writeback]\nwrite_chunk = \"2GiB\"\n", "writeback.write_chunk", 2, "must be at most 1073741824 bytes (1GiB)"},
		{"UTF-16 LE byte-order mark", "\xff\xfe[[watch]]\npath = \"/srv\"\n", "", 1, "UTF-16 or UTF-32 byte-order mark"},
		{"UTF-16 BE byte-order mark", "\xfe\xff", "", 1, "UTF-16 or UTF-32 byte-order mark"},
		{"UTF-32 BE byte-order mark", "\x00\x00\xfe\xff", "", 1, "UTF-16 or UTF-32 byte-order mark"},
		{"UTF-8 byte-order mark, then an error on line 3", "\xef\xbb\xbf[writeback]\n\nwrite_chunk = \"2GiB\"\n", "writeback.write_chunk", 3, "must be at most"},
		{"max_inflight below 256KiB", "[writeback]\nmax_inflight = \"1K\"\n", "writeback.max_inflight", 2, "must be 0 (no bound) or at least 262144 bytes"},
		{"max_inflight_bytes a page", "[plug]\nmax_inflight_bytes = 4096\n", "plug.max_inflight_bytes", 2, "must be 0 (no bound) or at least 262144 bytes"},
		{"max_inflight_bytes negative", "[plug]\nmax_inflight_bytes = -1\n", "plug.max_inflight_bytes", 2, "must be 0 (no bound) or at least 262144 bytes"},
		{"both inflight keys", "[writeback]\nmax_inflight = \"32MiB\"\n[plug]\nmax_inflight_bytes = \"32MiB\"\n", "writeback.max_inflight", 2, "plug.max_inflight_bytes is given too"},
		{"dirty_background_bytes negative", "[writeback]\ndirty_background_bytes = -4096\n", "writeback.dirty_background_bytes", 2, "must be 0 (off) or at least 4096 bytes"},
		{"dirty_background_bytes below a page", "[writeback]\ndirty_background_bytes = 1000\n", "writeback.dirty_background_bytes", 2, "must be 0 (off) or at least 4096 bytes"},
		{"write_chunk Auto", "[writeback]\nwrite_chunk = \"Auto\"\n", "writeback.write_chunk", 2, `or "auto"`},
		{"max_tracked_inodes 0", "[writeback]\nmax_tracked_inodes = 0\n", "writeback.max_tracked_inodes", 2, `at least 1, "auto" (from the memory limit) or "unlimited"`},
		{"max_tracked_inodes negative", "[writeback]\nmax_tracked_inodes = -5\n", "writeback.max_tracked_inodes", 2, "got integer -5"},
		{"max_tracked_inodes a size", "[writeback]\nmax_tracked_inodes = \"1M\"\n", "writeback.max_tracked_inodes", 2, `got string "1M"`},
		{"dirty_background_ratio over 100", "[writeback]\ndirty_background_ratio = 101\n", "writeback.dirty_background_ratio", 2, "percentage from 0 (off) to 100"},
		{"dirty_background_ratio negative", "[writeback]\ndirty_background_ratio = -1\n", "writeback.dirty_background_ratio", 2, "percentage from 0 (off) to 100"},
		{"dirty_background_ratio a string", "[writeback]\ndirty_background_ratio = \"10%\"\n", "writeback.dirty_background_ratio", 2, "want an integer"},
		{"range_bytes below a page", "[writeback]\nrange_bytes = 100\n", "writeback.range_bytes", 2, "must be 0 (off) or at least 4096"},
		{"range_bytes bad unit", "[writeback]\nrange_bytes = \"1MB\"\n", "writeback.range_bytes", 2, "ambiguous unit"},
		{"write_chunk another word", "[writeback]\nwrite_chunk = \"automatic\"\n", "writeback.write_chunk", 2, "bad size"},
		{"size negative", "[writeback]\nwrite_chunk = -4096\n", "writeback.write_chunk", 2, "must be at least 4096 bytes"},

		// Non-positive values.
		{"zero interval", "[writeback]\ndirty_writeback_interval = \"0s\"\n", "writeback.dirty_writeback_interval", 2, `must be positive, got "0s"`},
		{"negative pause", "[writeback]\nmax_pause = \"1s\"\nmin_pause = \"-1ms\"\n", "writeback.min_pause", 3, `must be positive, got "-1ms"`},
		{"zero expire", "[writeback]\ndirty_expire_interval = \"0s\"\n", "writeback.dirty_expire_interval", 2, "must be positive"},
		{"zero watch expire", "[[watch]]\npath = \"/a\"\nexpire = \"0s\"\n", "watch[0].expire", 3, "must be positive"},
		{"zero max_pending", "[plug]\nmax_pending = 0\n", "plug.max_pending", 2, "must be positive, got 0"},
		{"negative queue_depth", "[plug]\nenabled = false\nqueue_depth = -1\n", "plug.queue_depth", 3, "must be positive, got -1"},
		{"unknown backend", "[watcher]\n\nbackend = \"kqueue\"\n", "watcher.backend", 3, `"kqueue"`},
		{"rescan without unit", "[watcher]\nrescan_interval = 30\n", "watcher.rescan_interval", 2, "unit"},
		{"tiny rescan", "[watcher]\nrescan_interval = \"1ms\"\n", "watcher.rescan_interval", 2, "at least"},
		{"sweep without unit", "[watcher]\nsweep_interval = 5\n", "watcher.sweep_interval", 2, "unit"},
		{"tiny sweep", "[watcher]\nsweep_interval = \"1ms\"\n", "watcher.sweep_interval", 2, "at least"},
		{"negative sweep", "[watcher]\nsweep_interval = \"-1s\"\n", "watcher.sweep_interval", 2, "must be positive"},
		{"sweep another word", "[watcher]\nsweep_interval = \"Auto\"\n", "watcher.sweep_interval", 2, "unit"},

		// min_pause > max_pause.
		{"min_pause > max_pause", "[writeback]\nmax_pause = \"1s\"\nmin_pause = \"2s\"\n", "writeback.min_pause", 3, "min_pause 2s is greater than max_pause 1s"},
		{"min_pause > max_pause, max last", "[writeback]\nmin_pause = \"2s\"\nmax_pause = \"1s\"\n", "writeback.max_pause", 3, "min_pause 2s is greater than max_pause 1s"},
		{"min_pause > default max_pause", "[writeback]\nmin_pause = \"6s\"\n", "writeback.min_pause", 2, "max_pause 1s (max_pause defaults to dirty_writeback_interval)"},
		{"interval below min_pause", "[writeback]\nmin_pause = \"20ms\"\ndirty_writeback_interval = \"15ms\"\n", "writeback.dirty_writeback_interval", 3, "min_pause 20ms is greater than max_pause 15ms"},
		{"interval below the minimum", "[writeback]\ndirty_writeback_interval = \"1us\"\nmin_pause = \"1ms\"\n", "writeback.dirty_writeback_interval", 2, "must be at least 10ms"},
		{"min_pause below the minimum", "[writeback]\nmin_pause = \"1ns\"\n", "writeback.min_pause", 2, "must be at least 1ms"},
		{"stats dir inside a watched tree", "[stats]\ndir = \"/srv/run\"\n[[watch]]\npath = \"/srv\"\n", "stats.dir", 2, "inside the watched tree"},

		// Enums and other types.
		{"bad requeue_blocked", "[writeback]\nrequeue_blocked = \"later\"\n", "writeback.requeue_blocked", 2, `unknown value "later", want "io_wait" or "redirty_tail"`},
		{"bad log level", "[log]\nlevel = \"verbose\"\n", "log.level", 2, `unknown value "verbose", want "debug", "info", "warn" or "error"`},
		{"bad watch mode", "[[watch]]\npath = \"/a\"\n[[watch]]\npath = \"/b\"\nmode = \"sync\"\n", "watch[1].mode", 5, `want "writeback" or "integrity"`},
		{"string boolean", "[plug]\nenabled = \"yes\"\n", "plug.enabled", 2, `want true or false, got string "yes"`},
		{"string integer", "[plug]\nmax_pending = \"256\"\n", "plug.max_pending", 2, `want an integer, got string "256"`},
		{"integer level", "[log]\nlevel = 1\n", "log.level", 2, "want a string, got integer 1"},
		{"bad log format", "[log]\nformat = \"text\"\n", "log.format", 2, `unknown value "text", want "console" or "json"`},
		{"table is a value", "writeback = 5\n", "writeback", 1, "want a table, got integer 5"},
		{"watch is a table", "[watch]\npath = \"/a\"\n", "watch", 1, "want an array of tables"},
		{"watch element not a table", "watch = [\"/a\"]\n", "watch[0]", 1, "want a table"},
		{"empty stats dir", "[stats]\ndir = \"\"\n", "stats.dir", 2, "must not be empty"},

		// metrics.listen.
		{"listen without port", "[metrics]\n\nlisten = \"127.0.0.1\"\n", "metrics.listen", 3, `metrics.listen: bad address "127.0.0.1": missing port in address: want host:port`},
		{"listen port only", "[metrics]\nlisten = \"9469\"\n", "metrics.listen", 2, "missing port in address"},
		{"listen bare IPv6", "[metrics]\nlisten = \"::1:9469\"\n", "metrics.listen", 2, "too many colons"},
		{"listen port name", "[metrics]\nlisten = \"localhost:http\"\n", "metrics.listen", 2, `port "http" is not a number from 1 to 65535`},
		{"listen port zero", "[metrics]\nlisten = \"127.0.0.1:0\"\n", "metrics.listen", 2, `port "0" is not a number from 1 to 65535`},
		{"listen port too large", "[metrics]\nlisten = \"127.0.0.1:65536\"\n", "metrics.listen", 2, "from 1 to 65535"},
		{"listen empty port", "[metrics]\nlisten = \"127.0.0.1:\"\n", "metrics.listen", 2, `port ""`},
		{"listen negative port", "[metrics]\nlisten = \"127.0.0.1:-1\"\n", "metrics.listen", 2, "from 1 to 65535"},
		{"listen not a string", "[metrics]\nlisten = 9469\n", "metrics.listen", 2, "want a string, got integer 9469"},
		{"unknown metrics key", "[metrics]\nport = 9469\n", "metrics.port", 2, "unknown key, want one of listen"},

		// Watch paths (no file system access in Parse).
		{"watch without path", "[[watch]]\npath = \"/a\"\n\n[[watch]]\nmode = \"integrity\"\n", "watch[1].path", 4, "missing: every [[watch]] needs a path"},
		{"watch empty path", "[[watch]]\npath = \"\"\n", "watch[0].path", 2, "must not be empty"},
		{"watch path not a string", "[[watch]]\npath = 1\n", "watch[0].path", 2, "want a string"},
		{"duplicate watch", "[[watch]]\npath = \"/srv/a\"\n[[watch]]\npath = \"/srv/b\"\n[[watch]]\npath = \"/srv//a/\"\n", "watch[2].path", 6, `"/srv/a" is already watched by watch[0] (line 2)`},

		// The first problem in file order is reported.
		{"value error before a later decode error", "[writeback]\nshutdown_timeout = \"-1s\"\n[plug]\nmax_pending = 0\n[writeback.x]\n", "writeback.shutdown_timeout", 2, "must be positive"},
		{"first decode error in file order", "[writeback]\nmin_pause = 3\nbogus = 1\n", "writeback.min_pause", 2, "bad duration 3"},
		{"first value error in file order", "[plug]\nmax_pending = 0\n[writeback]\nattempt_timeout = \"0s\"\n", "plug.max_pending", 2, "must be positive"},
		{"first value error in file order 2", "[writeback]\nshutdown_timeout = \"-1s\"\n[plug]\nmax_pending = 0\n", "writeback.shutdown_timeout", 2, "must be positive"},
		{"value and decode errors in file order", "[plug]\nmax_pending = 0\n[writeback]\nmin_pause = 3\n", "plug.max_pending", 2, "must be positive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse("flusherd.toml", []byte(tt.src))
			if c != nil {
				t.Errorf("Parse returned a config with error %v", err)
			}
			e := asError(t, err)
			if e.File != "flusherd.toml" || e.Key != tt.key || e.Line != tt.line {
				t.Errorf("got File %q Key %q Line %d, want flusherd.toml, %q, %d (error: %v)", e.File, e.Key, e.Line, tt.key, tt.line, err)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("error %q does not contain %q", err, tt.msg)
			}
		})
	}
}

func TestErrorString(t *testing.T) {
	tests := []struct {
		e    Error
		want string
	}{
		{Error{File: "flusherd.toml", Line: 3, Key: "writeback.min_pause", Msg: "bad"}, "flusherd.toml:3: writeback.min_pause: bad"},
		{Error{File: "flusherd.toml", Key: "watch", Msg: "none"}, "flusherd.toml: watch: none"},
		{Error{Line: 2, Key: "log.level", Msg: "bad"}, "line 2: log.level: bad"},
		{Error{Key: "watch[0].path", Msg: "bad"}, "watch[0].path: bad"},
		{Error{File: "f", Line: 1, Msg: "syntax"}, "f:1: syntax"},
	}
	for _, tt := range tests {
		if got := tt.e.Error(); got != tt.want {
			t.Errorf("Error() = %q, want %q", got, tt.want)
		}
	}
}

func TestValidate(t *testing.T) {
	dir := t.TempDir()
	a := filepath.Join(dir, "a")
	b := filepath.Join(dir, "b")
	file := filepath.Join(dir, "file")
	missing := filepath.Join(dir, "missing")
	for _, d := range []string{a, b} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	watch := func(p string) Watch {
		return Watch{Tree: tree.Tree{Root: p, Recursive: true, Mode: tree.ModeWriteback, Expire: 30 * time.Second}}
	}
	tests := []struct {
		name     string
		modify   func(c *Config)
		key, msg string
		notExist bool
	}{
		{name: "valid", modify: func(c *Config) { c.Watch = []Watch{watch(a), watch(b)} }},
		{name: "no watches (the daemon starts idle)", modify: func(c *Config) {}},
		{"missing path", func(c *Config) { c.Watch = []Watch{watch(a), watch(missing)} }, "watch[1].path", "does not exist", true},
		{"path is a file", func(c *Config) { c.Watch = []Watch{watch(file)} }, "watch[0].path", "is not a directory", false},
		{"below a file", func(c *Config) { c.Watch = []Watch{watch(filepath.Join(file, "x"))} }, "watch[0].path", "not a directory", false},
		{"duplicate", func(c *Config) { c.Watch = []Watch{watch(a), watch(b), watch(a + "/")} }, "watch[2].path", "already watched by watch[0]", false},
		{"relative", func(c *Config) { c.Watch = []Watch{watch("a")} }, "watch[0].path", "not an absolute path", false},
		{"empty path", func(c *Config) { c.Watch = []Watch{watch("")} }, "watch[0].path", "must not be empty", false},
		{"zero expire", func(c *Config) { c.Watch = []Watch{watch(a)}; c.Watch[0].Expire = 0 }, "watch[0].expire", "must be positive", false},
		{"bad mode", func(c *Config) { c.Watch = []Watch{watch(a)}; c.Watch[0].Mode = "" }, "watch[0].mode", "unknown value", false},
		{"zero interval", func(c *Config) { c.Watch = []Watch{watch(a)}; c.Writeback.DirtyWritebackInterval = 0 }, "writeback.dirty_writeback_interval", "must be positive", false},
		{"min > max", func(c *Config) { c.Watch = []Watch{watch(a)}; c.Writeback.MinPause = time.Minute }, "writeback.min_pause", "greater than max_pause", false},
		{"small chunk", func(c *Config) { c.Watch = []Watch{watch(a)}; c.Writeback.WriteChunk = 4095 }, "writeback.write_chunk", "at least 4096", false},
		{"bad requeue", func(c *Config) { c.Watch = []Watch{watch(a)}; c.Writeback.RequeueBlocked = "x" }, "writeback.requeue_blocked", "unknown value", false},
		{"bad level", func(c *Config) { c.Watch = []Watch{watch(a)}; c.Log.Level = "INFO" }, "log.level", "unknown value", false},
		{"zero queue depth", func(c *Config) { c.Watch = []Watch{watch(a)}; c.Plug.QueueDepth = 0 }, "plug.queue_depth", "must be positive", false},
		{"negative integrity_syncfs", func(c *Config) { c.Watch = []Watch{watch(a)}; c.Plug.IntegritySyncfs = -1 }, "plug.integrity_syncfs", "must be 0 (never) or positive", false},
		{"zero integrity_syncfs (never)", func(c *Config) { c.Watch = []Watch{watch(a)}; c.Plug.IntegritySyncfs = 0 }, "", "", false},
		{"no stats dir", func(c *Config) { c.Watch = []Watch{watch(a)}; c.Stats.Dir = "" }, "stats.dir", "must not be empty", false},
		{"metrics listen", func(c *Config) { c.Watch = []Watch{watch(a)}; c.Metrics.Listen = "127.0.0.1:9469" }, "", "", false},
		{"bad metrics listen", func(c *Config) { c.Watch = []Watch{watch(a)}; c.Metrics.Listen = "nowhere" }, "metrics.listen", "missing port", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			tt.modify(c)
			err := c.Validate()
			if tt.key == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			e := asError(t, err)
			if e.Key != tt.key || e.Line != 0 || e.File != "" {
				t.Errorf("got File %q Key %q Line %d, want no file, %q, 0 (error: %v)", e.File, e.Key, e.Line, tt.key, err)
			}
			if !strings.Contains(e.Msg, tt.msg) {
				t.Errorf("error %q does not contain %q", err, tt.msg)
			}
			if got := errors.Is(err, fs.ErrNotExist); got != tt.notExist {
				t.Errorf("errors.Is(err, fs.ErrNotExist) = %v, want %v", got, tt.notExist)
			}
		})
	}
}

// Errors found by Validate on a parsed config carry the file and line.
func TestValidatePositions(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "a"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		src      string
		key      string
		line     int
		msg      string
		notExist bool
	}{
		{"missing", "[[watch]]\npath = \"a\"\n\n[[watch]]\n  path = \"nope\"\n", "watch[1].path", 5, `nope" does not exist`, true},
		{"file", "[log]\nlevel = \"warn\"\n[[watch]]\npath = 'f'\n", "watch[0].path", 4, `f" is not a directory`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Chdir(dir)
			c, err := Parse("cfg.toml", []byte(tt.src))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			e := asError(t, c.Validate())
			if e.File != "cfg.toml" || e.Key != tt.key || e.Line != tt.line || !strings.Contains(e.Msg, tt.msg) {
				t.Errorf("Validate() = %+v, want cfg.toml:%d, key %q, msg containing %q", e, tt.line, tt.key, tt.msg)
			}
			if got := errors.Is(e, fs.ErrNotExist); got != tt.notExist {
				t.Errorf("errors.Is(err, fs.ErrNotExist) = %v, want %v", got, tt.notExist)
			}
		})
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	if err := os.Mkdir(data, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, src string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}

	t.Run("missing file", func(t *testing.T) {
		_, err := Load(filepath.Join(dir, "nope.toml"))
		if !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("Load(missing) = %v, want an error wrapping fs.ErrNotExist", err)
		}
	})
	t.Run("valid", func(t *testing.T) {
		p := write("ok.toml", "[log]\nlevel = \"error\"\n[[watch]]\npath = \""+data+"\"\n")
		c, err := Load(p)
		if err != nil {
			t.Fatal(err)
		}
		want := Default()
		want.Log.Level = "error"
		want.Watch = []Watch{{Tree: tree.Tree{Root: data, Recursive: true, Mode: tree.ModeWriteback, Expire: 5 * time.Second}}}
		if diff := cmp.Diff(want, c, ignoreSrc); diff != "" {
			t.Errorf("Load mismatch (-want +got):\n%s", diff)
		}
		if err := c.Validate(); err != nil {
			t.Errorf("Validate: %v", err)
		}
	})
	t.Run("no watches is valid", func(t *testing.T) {
		c, err := Load(write("empty.toml", ""))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Validate(); err != nil || len(c.Watch) != 0 {
			t.Errorf("Validate() = %v with %d watches, want nil and none", err, len(c.Watch))
		}
	})
	t.Run("watch path checked", func(t *testing.T) {
		p := write("bad.toml", "[[watch]]\npath = \""+data+"\"\n[[watch]]\npath = \""+data+"/missing\"\n")
		_, err := Load(p)
		e := asError(t, err)
		if e.File != p || e.Line != 4 || e.Key != "watch[1].path" || !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("Load() = %v, want %s:4: watch[1].path wrapping fs.ErrNotExist", err, p)
		}
	})
	t.Run("parse error", func(t *testing.T) {
		p := write("syntax.toml", "[plug]\nmax_pending = \n")
		e := asError(t, func() error { _, err := Load(p); return err }())
		if e.File != p || e.Line != 2 {
			t.Errorf("Load() = %v, want %s:2", e, p)
		}
	})
}

func TestEncodeRoundTrip(t *testing.T) {
	full := Default()
	full.Writeback = Writeback{
		DirtyWritebackInterval: 1500 * time.Millisecond,
		DirtyExpireInterval:    2*time.Hour + 3*time.Minute,
		MinPause:               2500 * time.Microsecond,
		MaxPause:               7 * time.Second,
		WriteChunk:             768 << 20,
		DirtyBackgroundBytes:   7 << 20,
		DirtyBackgroundRatio:   100,
		RequeueBlocked:         RequeueRedirtyTail,
		AttemptTimeout:         15 * time.Millisecond,
		ShutdownTimeout:        time.Minute,
	}
	full.Plug = Plug{Enabled: false, MaxPending: 1, QueueDepth: 1000, MaxInflightBytes: 5 << 30}
	full.Stats.Dir = `/run/flusherd "quoted" \ dir`
	full.Log.Level = "warn"
	full.Metrics.Listen = "[::1]:9469"
	full.Watch = []Watch{
		{Tree: tree.Tree{Root: "/srv/data", Recursive: true, Mode: tree.ModeWriteback, Expire: 5 * time.Second}},
		{Tree: tree.Tree{Root: "/srv/weird name/ü", Recursive: false, Mode: tree.ModeIntegrity, Expire: 10 * time.Millisecond}},
	}
	odd := Default()
	odd.Writeback.WriteChunk = 4097 // not a multiple of any unit
	odd.Writeback.MaxPause = time.Second
	odd.Watch = []Watch{{Tree: tree.Tree{Root: "/x", Recursive: true, Mode: tree.ModeWriteback, Expire: time.Second}}}

	for name, c := range map[string]*Config{"default": Default(), "full": full, "odd": odd} {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := c.Encode(&buf); err != nil {
				t.Fatal(err)
			}
			got, err := Parse("encoded.toml", buf.Bytes())
			if err != nil {
				t.Fatalf("Parse(Encode()): %v\n%s", err, buf.String())
			}
			if diff := cmp.Diff(c, got, ignoreSrc); diff != "" {
				t.Errorf("round trip mismatch (-want +got):\n%s\n%s", diff, buf.String())
			}
		})
	}
}

// TestSweepInterval: watcher.sweep_interval is "auto" by default and when
// given so, "0" turns the sweep off, and a duration is taken as such; each
// is written back as given.
func TestSweepInterval(t *testing.T) {
	for _, c := range []struct {
		text     string
		auto     bool
		interval time.Duration
		encoded  string
	}{
		{"", true, 0, `sweep_interval = "auto"`},
		{"[watcher]\nsweep_interval = \"auto\"\n", true, 0, `sweep_interval = "auto"`},
		{"[watcher]\nsweep_interval = \"0\"\n", false, 0, `sweep_interval = "0s"`},
		{"[watcher]\nsweep_interval = \"2s\"\n", false, 2 * time.Second, `sweep_interval = "2s"`},
	} {
		cfg, err := Parse("t.toml", []byte(c.text))
		if err != nil {
			t.Fatalf("%q: %v", c.text, err)
		}
		if cfg.Watcher.SweepAuto != c.auto || cfg.Watcher.SweepInterval != c.interval {
			t.Errorf("%q: SweepAuto %v, SweepInterval %v; want %v, %v", c.text, cfg.Watcher.SweepAuto, cfg.Watcher.SweepInterval, c.auto, c.interval)
		}
		var buf bytes.Buffer
		if err := cfg.Encode(&buf); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(buf.String(), c.encoded) {
			t.Errorf("%q: encoded without %s:\n%s", c.text, c.encoded, buf.String())
		}
		again, err := Parse("again.toml", buf.Bytes())
		if err != nil || again.Watcher.SweepAuto != c.auto || again.Watcher.SweepInterval != c.interval {
			t.Errorf("%q: encoded and parsed again: %+v, %v", c.text, again.Watcher, err)
		}
	}
}

func TestEncodeDefault(t *testing.T) {
	var buf bytes.Buffer
	if err := Default().Encode(&buf); err != nil {
		t.Fatal(err)
	}
	text := buf.String()
	for _, want := range []string{
		"[writeback]\n", `dirty_writeback_interval = "1s"`, `min_pause = "10ms"`,
		`write_chunk = "4MiB"`, `requeue_blocked = "io_wait"`, "[plug]\n", "max_pending = 256",
		"[watcher]\n", `backend = "auto"`, `rescan_interval = "30s"`, `sweep_interval = "auto"`, "[stats]\n", `dir = "/run/flusherd"`, "[log]\n", `level = "info"`,
		"[metrics]\n", `listen = ""`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("Encode(Default()) lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "[[watch]]") {
		t.Errorf("Encode(Default()) has a watch:\n%s", text)
	}

	text += "\n[[watch]]\npath = \"/srv/data\"\n"
	got, err := Parse("default.toml", []byte(text))
	if err != nil {
		t.Fatalf("Parse: %v\n%s", err, text)
	}
	want := Default()
	want.Watch = []Watch{{Tree: tree.Tree{Root: "/srv/data", Recursive: true, Mode: tree.ModeWriteback, Expire: 5 * time.Second}}}
	if diff := cmp.Diff(want, got, ignoreSrc); diff != "" {
		t.Errorf("mismatch (-want +got):\n%s", diff)
	}
}

func TestSize(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"4096", 4096, true},
		{"4096B", 4096, true},
		{"512KiB", 512 << 10, true},
		{"512K", 512 << 10, true},
		{"4MiB", 4 << 20, true},
		{" 4 MiB ", 4 << 20, true},
		{"4M", 4 << 20, true},
		{"1GiB", 1 << 30, true},
		{"1G", 1 << 30, true},
		{"1kib", 0, false},
		{"1KB", 0, false},
		{"1TiB", 0, false},
		{"MiB", 0, false},
		{"-1MiB", 0, false},
		{"", 0, false},
		{"8589934592GiB", 0, false},
	} {
		got, err := parseSize(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("parseSize(%q) = %d, %v; want %d, ok %v", tt.in, got, err, tt.want, tt.ok)
		}
	}
	for _, tt := range []struct {
		in   int64
		want string
	}{
		{4 << 20, "4MiB"}, {3 << 30, "3GiB"}, {1536 << 10, "1536KiB"}, {4097, "4097B"}, {0, "0"},
	} {
		if got := formatSize(tt.in); got != tt.want {
			t.Errorf("formatSize(%d) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestScanLines(t *testing.T) {
	src := `# comment with [fake] header and key = "x"
top = 1
str = """
not_a_key = "inside a multi-line string"
[not_a_table]
"""
lit = '''
[[nor_this]]
'''
"quoted key" = 'x' # comment
a . "b.c" . d = 2

[tbl] # comment
x = [
  1, # comment
  2,
]
inline = { k1 = 1, k2 = { deep = "}" } }

[[arr]]
v = 1
[arr.sub]
w = 2
[[arr]]
  v = "[[x]]"
[[arr.items]]
i = 1
[[arr.items]]
i = 2
`
	want := map[string]int{
		"top": 2, "str": 3, "lit": 7, `"quoted key"`: 10,
		"a": 11, `a."b.c"`: 11, `a."b.c".d`: 11,
		"tbl": 13, "tbl.x": 14, "tbl.x[0]": 15, "tbl.x[1]": 16,
		"tbl.inline": 18, "tbl.inline.k1": 18, "tbl.inline.k2.deep": 18,
		"arr": 20, "arr[0]": 20, "arr[0].v": 21, "arr[0].sub": 22, "arr[0].sub.w": 23,
		"arr[1]": 24, "arr[1].v": 25,
		"arr[1].items": 26, "arr[1].items[0]": 26, "arr[1].items[0].i": 27,
		"arr[1].items[1]": 28, "arr[1].items[1].i": 29,
	}
	got, _ := scanLines(src)
	for k, l := range want {
		if got[k] != l {
			t.Errorf("line of %s = %d, want %d", k, got[k], l)
		}
	}
	for _, k := range []string{"not_a_key", "not_a_table", "nor_this", "x", "fake"} {
		if _, ok := got[k]; ok {
			t.Errorf("scanLines found key %q inside a string or comment", k)
		}
	}
}

// TestLoadSameDirTwice: two watches naming one directory, one of them
// through a symlink, are refused with the key and line of the second,
// whichever comes first.
func TestLoadSameDirTwice(t *testing.T) {
	dir := t.TempDir()
	real, link := filepath.Join(dir, "b"), filepath.Join(dir, "blink")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	for _, order := range [][2]string{{real, link}, {link, real}} {
		file := filepath.Join(dir, "c.toml")
		text := fmt.Sprintf("[[watch]]\npath = %q\n[[watch]]\npath = %q\n", order[0], order[1])
		if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		c, err := Load(file)
		if err == nil {
			err = c.Validate()
		}
		e := asError(t, err)
		if e.Key != "watch[1].path" || e.Line != 4 || !strings.Contains(e.Error(), "already watched by watch[0] (line 2)") {
			t.Errorf("%v: got %v", order, err)
		}
	}
}

// TestLoadSpecialFiles: a FIFO, a device or a directory given as the
// configuration is an error at once, never a hang or an endless read.
func TestLoadSpecialFiles(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{fifo, "/dev/zero", dir} {
		done := make(chan error, 1)
		go func() { _, err := Load(p); done <- err }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "not a regular file") && !strings.Contains(err.Error(), "directory") {
				t.Errorf("Load(%s) = %v, want a not-a-regular-file error", p, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("Load(%s) hung", p)
		}
	}
}

// TestValidateStatsDir: the stats directory is checked against what will
// use it: the control socket's path must fit in sun_path, and the
// directory may not be inside a watched tree, also not through a symlink
// of either path, and also when it does not exist yet.
func TestValidateStatsDir(t *testing.T) {
	base := t.TempDir()
	data := filepath.Join(base, "data")
	if err := os.MkdirAll(filepath.Join(data, "existing"), 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(data, link); err != nil {
		t.Fatal(err)
	}
	regular := filepath.Join(base, "file")
	if err := os.WriteFile(regular, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(base, "other"), 0o755); err != nil {
		t.Fatal(err)
	}
	watch := func(p string) Watch {
		return Watch{Tree: tree.Tree{Root: p, Recursive: true, Mode: tree.ModeWriteback, Expire: 30 * time.Second}}
	}
	for _, c := range []struct {
		name, stats, tree string
		msg               string // "" = valid
	}{
		{"outside", filepath.Join(base, "run"), data, ""},
		{"inside", filepath.Join(data, "run"), data, "inside the watched tree"},
		{"tree through a symlink, existing stats dir", filepath.Join(data, "existing"), link, "inside the watched tree"},
		{"tree through a symlink, stats dir not made yet", filepath.Join(data, "new", "run"), link, "inside the watched tree"},
		{"stats dir through a symlink", filepath.Join(link, "run"), data, "inside the watched tree"},
		{"socket path too long", "/" + strings.Repeat("d", MaxSocketPath-len("/flusherd.sock")), data, "too long"},
		{"socket path just fits", "/" + strings.Repeat("d", MaxSocketPath-len("/flusherd.sock")-1), data, ""},
		{"a regular file", regular, data, "is not a directory"},
		{"a symlink", link, filepath.Join(base, "other"), "a symbolic link"},
	} {
		cfg := Default()
		cfg.Stats.Dir = c.stats
		cfg.Watch = []Watch{watch(c.tree)}
		err := cfg.Validate()
		if c.msg == "" {
			if err != nil {
				t.Errorf("%s: Validate() = %v, want nil", c.name, err)
			}
			continue
		}
		// No file sets stats.dir here: a tree that holds it is blamed
		// (watch[0].path, with its line where a file gives one).
		key := "watch[0].path"
		if c.msg == "too long" || c.msg == "is not a directory" || c.msg == "a symbolic link" {
			key = "stats.dir"
		}
		if e := asError(t, err); e.Key != key || !strings.Contains(e.Msg, c.msg) {
			t.Errorf("%s: Validate() = %v, want a %s error containing %q", c.name, err, key, c.msg)
		}
		if e := asError(t, err); strings.Contains(e.Msg, fmt.Sprintf("%q (%q)", c.stats, c.stats)) || strings.Contains(e.Msg, fmt.Sprintf("%q (%q)", c.tree, c.tree)) {
			t.Errorf("%s: a path is repeated as what it resolves to: %v", c.name, err)
		}
	}
}

// TestOneErrorEach: one mistake is one error, not a second one for what
// follows from it: a dirty_writeback_interval below the minimum (not also
// for the max_pause that copies it), a watch path that is not a string
// (not also "must not be empty").
func TestOneErrorEach(t *testing.T) {
	for _, c := range []struct{ src, key string }{
		{"[writeback]\ndirty_writeback_interval = \"5ms\"\n", "writeback.dirty_writeback_interval"},
		{"[[watch]]\npath = 42\n", "watch[0].path"},
	} {
		p := filepath.Join(t.TempDir(), "c.toml")
		if err := os.WriteFile(p, []byte(c.src), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := Load(p)
		if es, ok := errors.AsType[Errors](err); ok && len(es) > 1 {
			t.Errorf("%q: Load = %v, want one error", c.src, err)
		}
		if e, ok := errors.AsType[*Error](err); !ok || e.Key != c.key {
			t.Errorf("%q: Load = %v, want an error on %s", c.src, err, c.key)
		}
	}
}

// TestLoadReportsEveryError: a file with several problems gets them all in
// one run, in file order, each with its line and key; errors.As still
// finds the first.
func TestLoadReportsEveryError(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "bad.toml")
	src := "[writeback]\ndirty_writeback_interval = \"0s\"\n[plug]\nqueue_depth = 0\n[[watch]]\npath = \"/nonexistent/x\"\n"
	if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Load(p)
	es, ok := errors.AsType[Errors](err)
	if !ok {
		t.Fatalf("Load = %v (%T), want Errors", err, err)
	}
	var got []string
	for _, e := range es {
		got = append(got, fmt.Sprintf("%d:%s", e.Line, e.Key))
	}
	// (Nothing for max_pause, unset: dirty_writeback_interval's error
	// says what is wrong with the default it copies.)
	want := []string{"2:writeback.dirty_writeback_interval", "4:plug.queue_depth", "6:watch[0].path"}
	if !slices.Equal(got, want) {
		t.Errorf("errors %q, want %q", got, want)
	}
	if e := asError(t, err); e.Line != 2 {
		t.Errorf("errors.As finds %v, want the first (line 2)", e)
	}
	if n := strings.Count(err.Error(), "\n"); n != len(es)-1 {
		t.Errorf("Error() has %d lines for %d errors:\n%s", n+1, len(es), err)
	}
}

// TestInheritedExpireErrorOnce: a bad writeback.dirty_expire_interval is
// reported once, at its line, not again for each [[watch]] that takes it
// as its expire; a watch's own bad expire is reported at its own line.
func TestInheritedExpireErrorOnce(t *testing.T) {
	for _, c := range []struct {
		src  string
		want []string
	}{
		{"[writeback]\ndirty_expire_interval = \"-5s\"\n[[watch]]\npath = \"/tmp\"\n",
			[]string{"2:writeback.dirty_expire_interval"}},
		{"[writeback]\ndirty_expire_interval = \"-5s\"\n[[watch]]\npath = \"/tmp\"\nexpire = \"-5s\"\n",
			[]string{"2:writeback.dirty_expire_interval", "5:watch[0].expire"}},
		{"[[watch]]\npath = \"/tmp\"\nexpire = \"0s\"\n",
			[]string{"3:watch[0].expire"}},
	} {
		p := filepath.Join(t.TempDir(), "c.toml")
		if err := os.WriteFile(p, []byte(c.src), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := LoadValues(p)
		es, ok := errors.AsType[Errors](err)
		if !ok {
			e, ok := errors.AsType[*Error](err)
			if !ok {
				t.Fatalf("%q: LoadValues = %v (%T), want Errors or *Error", c.src, err, err)
			}
			es = Errors{e}
		}
		var got []string
		for _, e := range es {
			got = append(got, fmt.Sprintf("%d:%s", e.Line, e.Key))
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%q: errors %q, want %q", c.src, got, c.want)
		}
	}
}

// TestMaxInflightFollowsWriteChunk: a write_chunk above the default
// max_inflight, with max_inflight unset, is accepted, and the bound
// becomes write_chunk (the default follows it).
func TestMaxInflightFollowsWriteChunk(t *testing.T) {
	c, err := Parse("f.toml", []byte("[writeback]\nwrite_chunk = \"64MiB\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if c.Plug.MaxInflightBytes != 64<<20 {
		t.Errorf("max_inflight_bytes = %d, want write_chunk (%d)", c.Plug.MaxInflightBytes, 64<<20)
	}
}

// TestBoundaries pins the limits at their edges, where an off-by-one would
// pass every test further away: the largest size that fits in int64, a
// min_pause equal to max_pause, write_chunk of exactly MinWriteChunk,
// MaxExpireClasses distinct expiries (one more is refused), a file of
// exactly MaxFileSize (one byte more is refused, and no byte of it is
// dropped), and the scanner's bare keys made of the first and last
// characters of each range, a document without a final newline, and a
// literal string that holds what looks like a key.
func TestBoundaries(t *testing.T) {
	if got, err := parseSize("8589934591GiB"); err != nil || got != 8589934591<<30 {
		t.Errorf("parseSize(8589934591GiB) = %d, %v; want %d", got, err, int64(8589934591)<<30)
	}

	dir := t.TempDir()
	var dirs []string
	for i := range MaxExpireClasses + 1 {
		d := filepath.Join(dir, fmt.Sprintf("d%03d", i))
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, d)
	}
	watches := func(n int) []Watch {
		var out []Watch
		for i := range n {
			out = append(out, Watch{Tree: tree.Tree{Root: dirs[i], Recursive: true, Mode: tree.ModeWriteback, Expire: time.Duration(i+1) * time.Second}})
		}
		return out
	}
	for _, tt := range []struct {
		name   string
		modify func(c *Config)
		key    string // "" : valid
	}{
		{"min_pause = max_pause", func(c *Config) { c.Writeback.MinPause, c.Writeback.MaxPause = time.Second, time.Second }, ""},
		{"write_chunk = MinWriteChunk", func(c *Config) { c.Writeback.WriteChunk, c.Plug.MaxInflightBytes = MinWriteChunk, MinMaxInflight }, ""},
		{"max_inflight_bytes of 256KiB, below write_chunk", func(c *Config) { c.Plug.MaxInflightBytes = MinMaxInflight }, ""},
		{"max_inflight_bytes a byte under 256KiB", func(c *Config) { c.Plug.MaxInflightBytes = MinMaxInflight - 1 }, "plug.max_inflight_bytes"},
		{"MaxExpireClasses expiries", func(c *Config) { c.Watch = watches(MaxExpireClasses) }, ""},
		{"one expiry more", func(c *Config) { c.Watch = watches(MaxExpireClasses + 1) }, "watch"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			if c.Watch == nil {
				c.Watch = watches(1)
			}
			tt.modify(c)
			err := c.Validate()
			if tt.key == "" && err != nil {
				t.Fatalf("Validate: %v", err)
			}
			if tt.key != "" && (err == nil || !strings.Contains(err.Error(), tt.key)) {
				t.Fatalf("Validate: %v, want an error naming %s", err, tt.key)
			}
		})
	}

	// A file of exactly MaxFileSize whose last byte matters: its
	// closing quote.
	tail := `[log]` + "\n" + `level = "error"`
	pad := "#" + strings.Repeat("x", MaxFileSize-len(tail)-2) + "\n"
	exact := filepath.Join(dir, "exact.toml")
	if err := os.WriteFile(exact, []byte(pad+tail), 0o644); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(exact); fi.Size() != MaxFileSize {
		t.Fatalf("test file is %d bytes, want %d", fi.Size(), MaxFileSize)
	}
	if c, err := Load(exact); err != nil || c.Log.Level != "error" {
		t.Errorf("Load of a file of exactly MaxFileSize: %v, level %q", err, levelOf(c))
	}
	over := filepath.Join(dir, "over.toml")
	if err := os.WriteFile(over, []byte("#"+pad+tail), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(over); err == nil {
		t.Error("Load of a file one byte over MaxFileSize succeeded")
	}

	got, _ := scanLines("# c\n'lit key' = 1\na = 1\nz=1\nA=1\nZ=1\n0=1\n9=1\n_-=1\nq = 'x[y] = z'\nr = 1\n[t]\nk = 1")
	want := map[string]int{`"lit key"`: 2, "a": 3, "z": 4, "A": 5, "Z": 6, "0": 7, "9": 8, "_-": 9, "q": 10, "r": 11, "t": 12, "t.k": 13}
	for k, l := range want {
		if got[k] != l {
			t.Errorf("scanLines: line of %s = %d, want %d", k, got[k], l)
		}
	}
	if len(got) != len(want) {
		t.Errorf("scanLines found %v, want exactly %v", got, want)
	}
}

func levelOf(c *Config) string {
	if c == nil {
		return ""
	}
	return c.Log.Level
}

// TestWriteChunkAuto: write_chunk = "auto" is read, written back as
// "auto", and frees max_inflight_bytes from following write_chunk (the
// chunk follows the bandwidth, and is bounded by max_inflight_bytes).
func TestWriteChunkAuto(t *testing.T) {
	c, err := Parse("f.toml", []byte("[writeback]\nwrite_chunk = \"auto\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if !c.Writeback.WriteChunkAuto || c.Plug.MaxInflightBytes != 16<<20 {
		t.Errorf("auto: WriteChunkAuto %v, max_inflight_bytes %d; want true, 16MiB", c.Writeback.WriteChunkAuto, c.Plug.MaxInflightBytes)
	}
	var buf bytes.Buffer
	if err := c.Encode(&buf); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "write_chunk = \"auto\"") {
		t.Errorf("encoded without write_chunk = \"auto\":\n%s", buf.String())
	}
	back, err := Parse("g.toml", buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(c, back, ignoreSrc); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
}

// TestMaxTrackedInodes: max_tracked_inodes is "auto" by default, reads
// "auto", "unlimited" and a count, and is written back as it was read.
func TestMaxTrackedInodes(t *testing.T) {
	for _, c := range []struct {
		text string
		want int64
		enc  string
	}{
		{"", MaxTrackedAuto, `max_tracked_inodes = "auto"`},
		{"max_tracked_inodes = \"auto\"\n", MaxTrackedAuto, `max_tracked_inodes = "auto"`},
		{"max_tracked_inodes = \"unlimited\"\n", MaxTrackedUnlimited, `max_tracked_inodes = "unlimited"`},
		{"max_tracked_inodes = 300\n", 300, "max_tracked_inodes = 300"},
	} {
		c0, err := Parse("f.toml", []byte("[writeback]\n"+c.text))
		if err != nil {
			t.Fatalf("%q: %v", c.text, err)
		}
		if err := c0.Validate(); err != nil {
			t.Fatalf("%q: Validate: %v", c.text, err)
		}
		if got := c0.Writeback.MaxTrackedInodes; got != c.want {
			t.Errorf("%q: MaxTrackedInodes %d, want %d", c.text, got, c.want)
		}
		var buf bytes.Buffer
		if err := c0.Encode(&buf); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(buf.String(), c.enc) {
			t.Errorf("%q: encoded without %s:\n%s", c.text, c.enc, buf.String())
		}
		back, err := Parse("g.toml", buf.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(c0, back, ignoreSrc); diff != "" {
			t.Errorf("%q: round trip (-want +got):\n%s", c.text, diff)
		}
	}
}

// TestNotes: a key given under its old name is accepted and noted, with
// the file and line; the new name is not.
func TestNotes(t *testing.T) {
	c, err := Parse("f.toml", []byte("[writeback]\nmin_pause = \"10ms\"\nmax_inflight = \"8MiB\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if n := c.Notes(); len(n) != 1 || n[0] != "f.toml:3: writeback.max_inflight: the old name of plug.max_inflight_bytes, still read: rename it" {
		t.Errorf("Notes() = %q", n)
	}
	if c.Plug.MaxInflightBytes != 8<<20 {
		t.Errorf("max_inflight = %d, want 8MiB", c.Plug.MaxInflightBytes)
	}
	c, err = Parse("g.toml", []byte("[plug]\nmax_inflight_bytes = \"8MiB\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if n := c.Notes(); n != nil {
		t.Errorf("Notes() = %q, want none", n)
	}
}

// TestFlagWatchErrors: an entry added by a command-line flag (Watch.Flag)
// is named by the flag in Validate's errors, with no file or line; one
// that repeats a file's entry names that entry with its file and line.
func TestFlagWatchErrors(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "c.toml")
	if err := os.WriteFile(file, []byte(fmt.Sprintf("[[watch]]\npath = %q\nmode = \"integrity\"\n", dir)), 0o644); err != nil {
		t.Fatal(err)
	}
	flagWatch := func(c *Config, p string) {
		c.Watch = append(c.Watch, Watch{Tree: tree.Tree{Root: p, Recursive: true, Mode: tree.ModeWriteback, Expire: c.Writeback.DirtyExpireInterval}, Flag: "--watch"})
	}
	for _, tc := range []struct {
		name, path, want string
	}{
		{"missing", filepath.Join(dir, "nope"), `--watch: "` + filepath.Join(dir, "nope") + `" does not exist`},
		{"a file", file, `--watch: "` + file + `" is not a directory`},
		{"the file's", dir, `--watch: "` + dir + `" is already watched by watch[0] (` + file + `:2)`},
	} {
		c, err := Load(file)
		if err != nil {
			t.Fatal(err)
		}
		flagWatch(c, tc.path)
		e := asError(t, c.Validate())
		if e.Key != "--watch" || e.File != "" || e.Line != 0 || e.Error() != tc.want {
			t.Errorf("%s: got %q (key %q, file %q, line %d), want %q", tc.name, e.Error(), e.Key, e.File, e.Line, tc.want)
		}
	}
	// The same flag twice.
	c := Default()
	flagWatch(c, dir)
	flagWatch(c, dir+"/")
	e := asError(t, c.Validate())
	if want := `--watch: "` + dir + `" is already watched by --watch "` + dir + `"`; e.Error() != want {
		t.Errorf("twice: got %q, want %q", e.Error(), want)
	}
}

// TestLoadErrorTexts: a configuration path that is not a regular file
// names its kind; a watch path holding a NUL is quoted, never written raw.
func TestLoadErrorTexts(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "not a regular file (a directory)") {
		t.Errorf("Load(a directory) = %v, want \"not a regular file (a directory)\"", err)
	}
	if _, err := Load("/dev/null"); err == nil || !strings.Contains(err.Error(), "not a regular file (a character device)") {
		t.Errorf("Load(/dev/null) = %v, want \"not a regular file (a character device)\"", err)
	}
	file := filepath.Join(dir, "c.toml")
	if err := os.WriteFile(file, []byte("[[watch]]\npath = \"/tmp/a\\u0000b\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := Load(file)
	if err == nil {
		err = c.Validate()
	}
	if err == nil || strings.ContainsRune(err.Error(), 0) || !strings.Contains(err.Error(), `watch[0].path: "/tmp/a\x00b": invalid argument`) {
		t.Errorf("a path with a NUL: %q", err)
	}
}

// TestDisplayPath: configuration file names with a newline, blanks or no
// name at all are quoted in errors; plain ones are not.
func TestDisplayPath(t *testing.T) {
	for in, want := range map[string]string{
		"/etc/flusherd/flusherd.toml": "/etc/flusherd/flusherd.toml",
		"a\nb":                        `"a\nb"`,
		" ":                           `" "`,
		"":                            `""`,
		"x\x00y":                      `"x\x00y"`,
	} {
		if got := displayPath(in); got != want {
			t.Errorf("displayPath(%q) = %s, want %s", in, got, want)
		}
	}
	if _, err := Load("a\nb"); err == nil || err.Error() != `"a\nb": no such file or directory` {
		t.Errorf("Load(a newline b) = %v", err)
	}
}

// TestSymlinkDuplicateOnce: a --watch path that repeats a file's entry
// by name, through a symlink both give, is one error, not two.
func TestSymlinkDuplicateOnce(t *testing.T) {
	dir := t.TempDir()
	real, link := filepath.Join(dir, "a"), filepath.Join(dir, "link")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "c.toml")
	if err := os.WriteFile(file, []byte(fmt.Sprintf("[[watch]]\npath = %q\n", link+"/")), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := Load(file)
	if err != nil {
		t.Fatal(err)
	}
	c.Watch = append(c.Watch, Watch{Tree: tree.Tree{Root: link, Recursive: true, Mode: tree.ModeWriteback, Expire: time.Minute}, Flag: "--watch"})
	err = c.Validate()
	if err == nil || strings.Count(err.Error(), "\n") != 0 || !strings.Contains(err.Error(), "already watched by watch[0]") {
		t.Errorf("Validate() = %v, want one \"already watched\" error", err)
	}
}

// TestUnknownKeyOffersNoOldName: an unknown key's error lists the keys to
// use, not an old name still read for compatibility
// (writeback.max_inflight, now plug.max_inflight_bytes).
func TestUnknownKeyOffersNoOldName(t *testing.T) {
	_, err := Parse("flusherd.toml", []byte("[writeback]\ndirty_expire = \"30s\"\n"))
	if err == nil || !strings.Contains(err.Error(), "want one of attempt_timeout,") {
		t.Fatalf("err = %v, want an unknown-key error listing the keys", err)
	}
	if strings.Contains(err.Error(), "max_inflight,") || strings.Contains(err.Error(), "max_inflight\n") {
		t.Errorf("the error offers the old name max_inflight: %v", err)
	}
}

// TestBindMountedTwice: one directory configured under two names through
// a bind mount is refused, naming both entries, as a symlinked duplicate
// is (it would be watched twice, its files reported under one name and
// with that tree's settings: an integrity tree served in writeback mode).
func TestBindMountedTwice(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mount --bind")
	}
	base := t.TempDir()
	real, bind := filepath.Join(base, "real"), filepath.Join(base, "bind")
	for _, d := range []string{real, bind} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Mount(real, bind, "", syscall.MS_BIND, ""); err != nil {
		t.Fatalf("bind mount: %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(bind, 0); err != nil {
			t.Errorf("unmount %s: %v", bind, err)
		}
	})
	p := filepath.Join(base, "c.toml")
	src := fmt.Sprintf("[stats]\ndir = %q\n[[watch]]\npath = %q\n[[watch]]\npath = %q\nmode = \"integrity\"\n", filepath.Join(base, "stats"), bind, real)
	if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Load(p)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("watch[1].path: %q is the directory watch[0] (line 4) watches, under another name (a bind mount)", real)) {
		t.Errorf("Load = %v, want watch[1] refused as watch[0]'s directory", err)
	}
}

// TestLoadEveryError: a file with problems of every stage (a bad duration,
// a size without a known unit, an unknown backend, a missing watch path, an
// unknown mode, a type error in a watch entry) reports all of them in one
// run, in file order, each with its line and key, and a key with a type
// problem is not reported again for its value.
func TestLoadEveryError(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "flusherd.toml")
	src := strings.Join([]string{
		`[writeback]`,
		`dirty_expire_interval = "5 sec"`,
		`write_chunk = "4MB"`,
		`[watcher]`,
		`backend = "fanotfy"`,
		`[[watch]]`,
		`path = "` + filepath.Join(dir, "missing") + `"`,
		`[[watch]]`,
		`path = "` + dir + `"`,
		`mode = "integrty"`,
		`[[watch]]`,
		`path = "` + dir + `/b"`,
		`recursive = "yes"`,
	}, "\n") + "\n"
	if err := os.Mkdir(filepath.Join(dir, "b"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	var es Errors
	if !errors.As(err, &es) {
		t.Fatalf("Load: %v (%T), want Errors", err, err)
	}
	want := []struct {
		line int
		key  string
	}{
		{2, "writeback.dirty_expire_interval"},
		{3, "writeback.write_chunk"},
		{5, "watcher.backend"},
		{7, "watch[0].path"},
		{10, "watch[1].mode"},
		{13, "watch[2].recursive"},
	}
	var got []string
	for _, e := range es {
		got = append(got, fmt.Sprintf("%d %s", e.Line, e.Key))
	}
	if len(es) != len(want) {
		t.Fatalf("got %d errors, want %d:\n%v", len(es), len(want), err)
	}
	for i, w := range want {
		if es[i].Line != w.line || es[i].Key != w.key || es[i].File == "" {
			t.Errorf("error %d: %s:%d %s, want line %d key %s\n(all: %v)", i, es[i].File, es[i].Line, es[i].Key, w.line, w.key, got)
		}
	}
}

// TestLoadClient: the client commands take stats.dir from a file whose
// problems are elsewhere (reported apart), but not from one whose
// stats.dir has a problem or that does not parse.
func TestLoadClient(t *testing.T) {
	for _, c := range []struct {
		src, dir string // dir "": an error
		others   []string
	}{
		{"[stats]\ndir = \"/run/x\"\n", "/run/x", nil},
		{"[writeback]\nbogus = 1\nmin_pause = \"-1s\"\n[stats]\ndir = \"/run/x\"\n", "/run/x", []string{"writeback.bogus", "writeback.min_pause"}},
		{"[writeback]\nbogus = 1\n", "/run/flusherd", []string{"writeback.bogus"}},
		{"[writeback]\nbogus = 1\n[stats]\ndir = \"\"\n", "", nil},
		{"[stats]\ndir = 5\n", "", nil},
		{"[stats]\ndri = \"/run/x\"\n", "", nil}, // (meant for dir)
		{"stats = 5\n", "", nil},
		{"[stats\n", "", nil},
	} {
		p := filepath.Join(t.TempDir(), "c.toml")
		if err := os.WriteFile(p, []byte(c.src), 0o644); err != nil {
			t.Fatal(err)
		}
		cfg, others, err := LoadClient(p)
		if c.dir == "" {
			if err == nil {
				t.Errorf("%q: no error (stats.dir %q)", c.src, cfg.Stats.Dir)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", c.src, err)
			continue
		}
		if cfg.Stats.Dir != c.dir {
			t.Errorf("%q: stats.dir %q, want %q", c.src, cfg.Stats.Dir, c.dir)
		}
		var got []string
		es, _ := errors.AsType[Errors](others)
		if e, ok := errors.AsType[*Error](others); ok && es == nil {
			es = Errors{e}
		}
		for _, e := range es {
			got = append(got, e.Key)
		}
		if !slices.Equal(got, c.others) {
			t.Errorf("%q: others %q, want %q", c.src, got, c.others)
		}
	}
}

// TestLoadKeeping: LoadKeeping consults keep only for a watch path whose
// stat fails with something other than a missing or misnamed path, and
// not for a path that does not exist, a symlink loop or a file: those
// stay problems, as with Load.
func TestLoadKeeping(t *testing.T) {
	dir := t.TempDir()
	loop := filepath.Join(dir, "loop")
	if err := os.Symlink(loop, loop); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(dir, "missing"), filepath.Join(loop, "x"), filepath.Join(file, "x"), file} {
		path := filepath.Join(t.TempDir(), "flusherd.toml")
		if err := os.WriteFile(path, fmt.Appendf(nil, "[[watch]]\npath = %q\n", p), 0o644); err != nil {
			t.Fatal(err)
		}
		asked := 0
		_, err := LoadKeeping(path, func(string, error) bool { asked++; return true })
		if err == nil || asked != 0 {
			t.Errorf("LoadKeeping with the watch path %s: %v, keep asked %d times; want an error, keep not asked", p, err, asked)
		}
	}
}
