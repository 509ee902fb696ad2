// Package config reads, checks and writes the flusherd configuration file.
//
// The file is TOML. Every key is optional; absent keys take the defaults
// shown below, and unknown keys are errors.
//
//	[writeback]
//	dirty_writeback_interval = "1s"   # kupdate period (the kernel's: 5s)
//	dirty_expire_interval    = "5s"   # age at which dirty data is written back (the kernel's: 30s)
//	min_pause        = "10ms"         # first backoff pause for b_more_io_wait
//	max_pause        = "1s"           # default: the effective dirty_writeback_interval
//	write_chunk      = "4MiB"         # most written back per inode per attempt; "auto": half a second of the device's bandwidth
//	dirty_background_bytes = "0"      # background writeback above this much dirty data per device; "0": off
//	dirty_background_ratio = 0        # or above this percentage of the kernel's background threshold; 0: off
//	range_bytes      = "1MiB"         # streaming files: write what lies behind the last range_bytes; "0": off
//	requeue_blocked  = "io_wait"      # or "redirty_tail"
//	attempt_timeout  = "10s"          # a longer call counts in stuck_calls; an integrity call is given up on
//	target_latency   = "25ms"         # writeback in flight per device sized so another write waits about this, and paced; "0": max_inflight_bytes, no pace
//	shutdown_timeout = "30s"          # bound on the final writeback at SIGTERM
//	max_tracked_inodes = "auto"       # files tracked at once; "auto": from the memory limit; "unlimited"; or a count
//
//	[plug]
//	enabled     = true
//	max_pending = 256                 # requests held before a forced flush
//	queue_depth = 8                   # requests in flight during a flush
//	integrity_syncfs = 64             # integrity batches of this many files of one filesystem use syncfs(2); 0: never
//	max_inflight_bytes = "16MiB"      # writeback in flight per device before big files, ranges and background work wait
//
//	[watcher]
//	backend         = "auto"          # "fanotify", "inotify", or auto: fanotify when permitted
//	rescan_interval = "30s"           # rescan of directories inotify could not watch
//	sweep_interval  = "auto"          # look at open and mapped files for data dirtied without an event; "auto": half each tree's expire; "0": off
//
//	[stats]
//	dir = "/run/flusherd"
//
//	[log]
//	level  = "info"                   # debug, info, warn, error
//	format = "console"                # or "json": one JSON object a line
//
//	[metrics]
//	listen = ""                       # host:port of a Prometheus /metrics endpoint, e.g. "127.0.0.1:9469"; "": off
//
//	[[watch]]                         # repeat for each tree; path is required
//	path      = "/srv/data"           # relative paths are resolved against the working directory
//	recursive = true
//	mode      = "writeback"           # or "integrity"
//	expire    = "30s"                 # default: writeback.dirty_expire_interval
//
// Durations are TOML strings accepted by [time.ParseDuration] ("500ms", "5s",
// "1m30s"); a bare TOML number or a string without a unit is an error, so
// that "10" is never silently read as ten nanoseconds. All durations must be
// positive.
//
// Sizes (write_chunk) are either a TOML integer counting bytes or a string of
// a whole number followed by an optional unit: "B" (or no unit) for bytes,
// "KiB" or "K" for 1024 bytes, "MiB" or "M" for 1024², "GiB" or "G" for
// 1024³; units are case-sensitive and always binary ("KB" and "MB" are
// rejected as ambiguous). write_chunk must be at least 4096 bytes, or
// "auto". A size of "0" turns dirty_background_bytes and range_bytes off.
//
// writeback.max_inflight, the key plug.max_inflight_bytes had before, is
// still read; giving both is an error.
//
// metrics.listen is empty (no metrics endpoint) or a host:port as
// [net.SplitHostPort] reads it with a numeric port from 1 to 65535; the host
// may be empty (all addresses), a name or an IP address ("[::1]:9469").
//
// Every error from [Parse], [Load] and [Config.Validate] is an [*Error] naming
// the dotted key (e.g. "writeback.min_pause", or "watch[1].path" for the
// second [[watch]] entry; indices are 0-based) and, when the configuration
// came from a file, the file name and line.
package config

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/BurntSushi/toml"

	"flusherd/tree"
)

// Values of [Writeback.RequeueBlocked]: what happens to an inode whose
// writeback attempt blocked (ran longer than attempt_timeout).
const (
	// RequeueIOWait parks the inode on b_more_io_wait and retries it after a
	// pause growing from min_pause to max_pause.
	RequeueIOWait = "io_wait"
	// RequeueRedirtyTail puts the inode back at the tail of the dirty list
	// with a fresh dirtied time, as if it had just been dirtied.
	RequeueRedirtyTail = "redirty_tail"
)

// LogLevels are the values of [Log.Level], lowest first.
var LogLevels = []string{"debug", "info", "warn", "error"}

// LogFormats are the values of [Log.Format].
var LogFormats = []string{"console", "json"}

// MinInterval is the shortest dirty_writeback_interval accepted (the
// kernel's dirty_writeback_centisecs counts in hundredths of a second).
const MinInterval = 10 * time.Millisecond

// MaxExpireClasses bounds the distinct expire intervals over all trees.
const MaxExpireClasses = 255

// MinWriteChunk is the smallest accepted [Writeback.WriteChunk], in bytes.
const MinWriteChunk = 4096

// MaxWriteChunk is the largest accepted [Writeback.WriteChunk], in bytes
// (1 GiB): half a second of a 2 GB/s device, as the kernel's
// writeback_chunk_size allows half a second of the device's bandwidth.
// A larger slice would also lift max_inflight_bytes' default with it.
const MaxWriteChunk = 1 << 30

// MinMaxInflight is the smallest accepted [Plug.MaxInflightBytes] other
// than 0, in bytes: no attempt writes more than the bound, so one of a
// few pages writes a page or two per attempt, far below any device's
// rate (4 KiB made a file appended at 6.4 MB/s miss its expiry by seconds).
const MinMaxInflight = 256 << 10

// Config is the whole flusherd configuration. Use [Default], [Parse] or
// [Load] to get one; the zero value is not valid.
type Config struct {
	Writeback Writeback
	Plug      Plug
	Watcher   Watcher
	Stats     Stats
	Log       Log
	Metrics   Metrics
	Watch     []Watch

	// src records where the configuration came from, so that Validate can
	// report file lines. nil for configurations not parsed from a file.
	src *source
	// keep, set by LoadKeeping, says which watch paths whose root cannot
	// be reached are not a problem (Validate too).
	keep func(root string, err error) bool
}

// Writeback is the [writeback] table: timing and sizing of writeback.
type Writeback struct {
	// DirtyWritebackInterval is the kupdate period. Default 1s (the kernel's is 5s).
	DirtyWritebackInterval time.Duration
	// DirtyExpireInterval is the age at which dirty data is written back.
	// Default 5s (the kernel's is 30s: a daemon that bounds dirty data per
	// tree should not wait as long as the kernel would anyway).
	DirtyExpireInterval time.Duration
	// MinPause is the first backoff pause for b_more_io_wait. Default 10ms.
	MinPause time.Duration
	// MaxPause is the largest backoff pause; must be >= MinPause. Default:
	// the effective DirtyWritebackInterval.
	MaxPause time.Duration
	// WriteChunk is the most bytes written back per inode per attempt; at
	// least MinWriteChunk. Default 4 MiB. Ignored when WriteChunkAuto.
	WriteChunk int64
	// WriteChunkAuto (write_chunk = "auto") sizes each attempt's slice
	// from the device's measured write bandwidth, as the kernel's
	// writeback_chunk_size does: half a second of it, rounded down to
	// 4 MiB, between 4 MiB and 128 MiB (and at most max_inflight_bytes);
	// 4 MiB until the bandwidth is known.
	WriteChunkAuto bool
	// DirtyBackgroundBytes is the background threshold, in bytes of dirty
	// data in the tracked files of one device: above it the device's
	// goroutine writes the oldest files first, whatever their age, until
	// it is under (the kernel's wb_over_bg_thresh for one bdi). 0 (the
	// default): no byte threshold.
	DirtyBackgroundBytes int64
	// DirtyBackgroundRatio is the background threshold as a percentage
	// (0 to 100) of the kernel's own, /proc/vmstat
	// nr_dirty_background_threshold. When both it and
	// DirtyBackgroundBytes are set, the lower threshold holds. 0 (the
	// default): off.
	DirtyBackgroundRatio int
	// RangeBytes, for files being written over time (streaming writers):
	// once a file has grown by 2 × RangeBytes past what was written back,
	// what lies behind its last RangeBytes is written back
	// (sync_file_range WRITE), as RocksDB's bytes_per_sync does; the hot
	// tail is left to the writer. 0: off. Default 1 MiB.
	RangeBytes int64
	// RequeueBlocked is RequeueIOWait (default) or RequeueRedirtyTail.
	RequeueBlocked string
	// AttemptTimeout: a writeback attempt running longer than this counts as
	// blocked. Default 10s.
	AttemptTimeout time.Duration
	// ShutdownTimeout bounds the final writeback at SIGTERM. Default 30s.
	ShutdownTimeout time.Duration
	// TargetLatency sizes the writeback flusherd keeps in flight on a
	// device so that a write queued behind it waits about this long: the
	// window is TargetLatency × the device's measured write bandwidth,
	// between 256 KiB and plug.max_inflight_bytes (the ceiling). 0: the
	// window is max_inflight_bytes. Default 25ms.
	TargetLatency time.Duration
	// MaxTrackedInodes bounds the files tracked at once, over all trees:
	// past it, new files are not tracked and their filesystems are
	// written back whole by syncfs(2) until the tracked files fall under
	// three quarters of it. MaxTrackedAuto (the default, "auto") derives
	// it from the daemon's memory limit; MaxTrackedUnlimited
	// ("unlimited") sets none.
	MaxTrackedInodes int64
}

// Values of [Writeback.MaxTrackedInodes] besides a count.
const (
	MaxTrackedAuto      = 0
	MaxTrackedUnlimited = -1
)

// Plug is the [plug] table: request plugging.
type Plug struct {
	// Enabled turns plugging on. Default true.
	Enabled bool
	// MaxPending is the number of requests held before a forced flush;
	// positive. Default 256.
	MaxPending int
	// QueueDepth is the number of requests in flight during a flush;
	// positive. Default 8.
	QueueDepth int
	// IntegritySyncfs is the number of integrity requests for one
	// filesystem in a batch from which the batch is made durable with one
	// syncfs(2) instead of an fdatasync(2) per file; 0 disables it.
	// syncfs also writes the filesystem's other dirty data. Default 64.
	IntegritySyncfs int
	// MaxInflightBytes bounds the writeback in flight on one device, in
	// bytes (pages under writeback, as cachestat last saw them in the
	// files flusherd tracks), as the kernel's writeback throttling
	// (blk-wbt) bounds in-flight writes: a file with more than
	// write_chunk/4 to write, a range writeback and background work wait
	// while this much is in flight, so the device queue stays short and a
	// small file's or another program's write does not wait behind a
	// stream. Small files always go. 0: no bound. Default 16 MiB, or
	// write_chunk when that is larger.
	MaxInflightBytes int64
}

// Watcher backends, the values of [Watcher.Backend].
const (
	BackendAuto     = "auto"
	BackendFanotify = "fanotify"
	BackendInotify  = "inotify"
)

// Watcher is the [watcher] table: how the trees are watched.
type Watcher struct {
	// Backend is BackendAuto (default: fanotify when the process may use
	// it, else inotify), BackendFanotify or BackendInotify.
	Backend string
	// RescanInterval is how often directories that inotify could not
	// watch (fs.inotify.max_user_watches reached) are rescanned with
	// cachestat. Default 30s.
	RescanInterval time.Duration
	// SweepInterval is how often the files open or mapped in the trees
	// are looked at with cachestat for data dirtied without an event (a
	// shared mapping, Linux AIO); 0 turns the sweep and the tracking of
	// opens off. Ignored when SweepAuto.
	SweepInterval time.Duration
	// SweepAuto (sweep_interval = "auto", the default): half each
	// tree's expire.
	SweepAuto bool
}

// SweepText is sweep_interval as the file writes it: "auto" or a
// duration.
func (w Watcher) SweepText() string {
	if w.SweepAuto {
		return "auto"
	}
	return w.SweepInterval.String()
}

// Stats is the [stats] table.
type Stats struct {
	// Dir is the directory statistics are written to; not empty. Default
	// "/run/flusherd".
	Dir string
}

// Log is the [log] table.
type Log struct {
	// Level is "debug", "info" (default), "warn" or "error".
	Level string
	// Format is "console" (default: tab-separated, the fields as one
	// JSON object) or "json" (each line one JSON object).
	Format string
}

// Metrics is the [metrics] table: the Prometheus endpoint.
type Metrics struct {
	// Listen is the host:port the /metrics endpoint listens on (TCP);
	// empty (default) means no endpoint.
	Listen string
}

// Watch is one [[watch]] entry: a directory tree flusherd manages.
type Watch struct {
	// Tree is the entry's tree. Root is its path key, cleaned and
	// absolute (required). Recursive defaults to true, Mode to
	// tree.ModeWriteback. Expire is its own expire key, or else
	// Writeback.DirtyExpireInterval; positive, and a Watch built in code
	// (e.g. from flags) must set it.
	tree.Tree
	// Flag is the command-line flag that added the entry (e.g.
	// "--watch"), "" for a [[watch]] table of the file: Validate's errors
	// name it rather than watch[i].
	Flag string
}

// Error is a configuration error. Errors from Parse, Load and Validate are
// of type *Error, except I/O errors reading the file in Load.
type Error struct {
	File string // file name given to Parse or Load; "" if not from a file
	Line int    // 1-based line in File; 0 if unknown
	Key  string // dotted key, e.g. "writeback.min_pause" or "watch[1].path"; "" if none
	Msg  string // what is wrong

	err  error  // underlying error, if any (e.g. from os.Stat)
	rank int    // File's place in the reading order (0: the main file)
	at   string // Key as the files read together number [[watch]] entries
}

// Error formats e as "file:line: key: msg", leaving out the parts that are
// unknown (File empty, Line 0, Key empty).
func (e *Error) Error() string {
	var b strings.Builder
	switch {
	case e.File != "" && e.Line > 0:
		fmt.Fprintf(&b, "%s:%d: ", displayPath(e.File), e.Line)
	case e.File != "":
		b.WriteString(displayPath(e.File) + ": ")
	case e.Line > 0:
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	if e.Key != "" {
		b.WriteString(e.Key + ": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Unwrap returns the underlying error, e.g. the os.Stat error for a missing
// watch path (so errors.Is(err, fs.ErrNotExist) works), or nil.
func (e *Error) Unwrap() error { return e.err }

// MaxSocketPath is the longest path a unix socket can be bound to: the
// 108 bytes of sockaddr_un's sun_path less the terminating NUL (unix(7)).
const MaxSocketPath = 107

// Default returns the default configuration, with no watches.
func Default() *Config {
	return &Config{
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
			MaxTrackedInodes:       MaxTrackedAuto,
		},
		Plug:    Plug{Enabled: true, MaxPending: 256, QueueDepth: 8, IntegritySyncfs: 64, MaxInflightBytes: 16 << 20},
		Watcher: Watcher{Backend: BackendAuto, RescanInterval: 30 * time.Second, SweepAuto: true},
		Stats:   Stats{Dir: "/run/flusherd"},
		Log:     Log{Level: "info", Format: "console"},
	}
}

// Load reads the file at path and parses it with [Parse], then checks that
// every watch path exists and is a directory. A missing file gives an error
// wrapping [fs.ErrNotExist].
//
// Load does not require at least one watch, so that command-line flags can
// add watches afterwards; call [Config.Validate] on the final configuration.
func Load(path string) (*Config, error) { return load(path, true, nil) }

// LoadValues is Load without the file system checks of the watch paths:
// the file is read, parsed and its values checked. It is for the client
// commands (stats, dirty, sync), which need stats.dir and must work while
// a watched filesystem is dead (a stat of its root fails with ENOTCONN)
// or missing.
func LoadValues(path string) (*Config, error) { return load(path, false, nil) }

// LoadClient is LoadValues for the client commands, which read stats.dir
// only: a file that reads and parses, and whose stats.dir has no problem,
// gives its values, the keys with a problem left at their defaults, and
// those problems in others (a file a reload refused still names the
// daemon's directory). A problem in [stats] (a misspelt key may be meant
// for dir), or a file that cannot be read or parsed, is err.
func LoadClient(path string) (c *Config, others error, err error) {
	c, checkErr, err := loadChecked(path, false, nil)
	if err != nil {
		return nil, nil, err
	}
	var es Errors
	var e *Error
	switch {
	case errors.As(checkErr, &es):
	case errors.As(checkErr, &e):
		es = Errors{e}
	}
	for _, e := range es {
		// Any problem in [stats] (a misspelt dir included) leaves
		// stats.dir in doubt.
		if e.Key == "stats" || strings.HasPrefix(e.Key, "stats.") {
			return nil, nil, checkErr
		}
	}
	return c, checkErr, nil
}

// load reads, parses and checks the file at path and its drop-ins (the
// *.toml files of DropInDir(path), in lexical order); stat adds the file
// system checks of the watch paths. The value and file system checks run
// together: every problem is reported at once.
func load(path string, stat bool, keep func(string, error) bool) (*Config, error) {
	c, checkErr, err := loadChecked(path, stat, keep)
	if err != nil {
		return nil, err
	}
	if checkErr != nil {
		return nil, checkErr
	}
	return c, nil
}

// LoadKeeping is Load for a reload: a watch path whose root cannot be
// reached for its filesystem's sake (a stat failing with an error other
// than ENOENT, ENOTDIR, ELOOP or ENAMETOOLONG: ENOTCONN from a FUSE
// server that died, EIO from a filesystem shut down) is not a problem where keep, called with the
// cleaned path and the error, says so: the running daemon serves it
// already. Validate on the result does the same.
func LoadKeeping(path string, keep func(root string, err error) bool) (*Config, error) {
	return load(path, true, keep)
}

// SetKeep sets, on a configuration not loaded with LoadKeeping (the
// default one), which unreachable watch paths Validate lets through.
func (c *Config) SetKeep(keep func(root string, err error) bool) { c.keep = keep }

// loadChecked is load, with the checks' problems (checkErr) apart from
// the errors that leave no configuration (err).
func loadChecked(path string, stat bool, keep func(string, error) bool) (c *Config, checkErr, err error) {
	data, err := readConfigFile(path)
	if err != nil {
		return nil, nil, err
	}
	files := []file{{path, data}}
	names, err := dropIns(DropInDir(path))
	if err != nil {
		return nil, nil, err
	}
	for _, n := range names {
		data, err := readConfigFile(n)
		if err != nil {
			return nil, nil, err
		}
		files = append(files, file{n, data})
	}
	c, decodeErrs, err := parseFiles(files)
	if err != nil {
		return nil, nil, err
	}
	c.keep = keep
	return c, c.check(stat, decodeErrs), nil
}

// MaxFileSize is the largest configuration file Load reads, in bytes.
const MaxFileSize = 16 << 20

// readConfigFile reads a configuration file without blocking: it is opened
// O_NONBLOCK (a FIFO does not wait for a writer) and must be a regular file
// of at most MaxFileSize bytes, so /dev/zero or a FIFO is an error, not a
// hang.
func readConfigFile(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if pe, ok := errors.AsType[*fs.PathError](err); ok {
		return nil, fmt.Errorf("%s: %w", displayPath(path), pe.Err)
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file (%s)", displayPath(path), fileKind(fi.Mode()))
	}
	if fi.Size() > MaxFileSize {
		return nil, fmt.Errorf("%s: %d bytes; a configuration file may have at most %d", displayPath(path), fi.Size(), MaxFileSize)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxFileSize {
		return nil, fmt.Errorf("%s: more than %d bytes; a configuration file may have at most %d", displayPath(path), MaxFileSize, MaxFileSize)
	}
	return data, nil
}

// Parse parses a TOML configuration; name is the file name used in errors.
// Absent keys take their defaults (see [Default]); relative watch paths are
// made absolute against the working directory. Parse checks the syntax, keys,
// types and values but not the file system and allows an empty watch list;
// [Config.Validate] does the rest.
//
// The error, if any, is an *Error, or Errors when there are several: a
// syntax error alone; else every key, type and value problem, in file
// order (a key with a type problem is not checked for its value as well).
// For a syntax error, Key is the last key the TOML parser read, which may
// precede the error.
func Parse(name string, data []byte) (*Config, error) {
	c, decodeErrs, err := parse(name, data)
	if err != nil {
		return nil, err
	}
	if err := c.check(false, decodeErrs); err != nil {
		return nil, err
	}
	return c, nil
}

// parse is Parse without the value checks: it returns the configuration,
// each key with a key or type problem left at its default, and those
// problems. A syntax error (err) returns no configuration.
func parse(name string, data []byte) (*Config, []*Error, error) {
	return parseFiles([]file{{name, data}})
}

// file is a configuration file's name and contents.
type file struct {
	name string
	data []byte
}

// parseFiles is parse of a main file and its drop-ins (files[1:]), in
// order: each drop-in's keys override those before, and its [[watch]]
// entries are added after theirs.
func parseFiles(files []file) (*Config, []*Error, error) {
	src := &source{file: files[0].name, locs: map[string]loc{}}
	var merged map[string]any
	for rank, f := range files {
		m, lines, err := decodeTOML(f.name, f.data)
		if err != nil {
			return nil, nil, err
		}
		offset := 0
		if merged == nil {
			merged = m
		} else {
			offset = mergeTables(merged, m)
		}
		for key, line := range lines {
			src.locs[globalKey(key, offset)] = loc{file: f.name, line: line, key: key, rank: rank}
		}
	}
	d := &decoder{src: src}
	c := d.config(merged)
	c.src = src
	return c, d.errs, nil
}

// decodeTOML decodes one file into the generic TOML tree, with the line
// of each key (scanLines).
func decodeTOML(name string, data []byte) (map[string]any, map[string]int, error) {
	if bytes.HasPrefix(data, []byte{0xff, 0xfe}) || bytes.HasPrefix(data, []byte{0xfe, 0xff}) || bytes.HasPrefix(data, []byte{0, 0, 0xfe, 0xff}) {
		// The TOML decoder drops a UTF-16 byte-order mark as if it were
		// UTF-8's, and would read what follows as garbage or nothing.
		// (FF FE 00 00 is UTF-32's, little-endian; 00 00 FE FF its
		// big-endian one.)
		return nil, nil, &Error{File: name, Line: 1, Msg: "the file starts with a UTF-16 or UTF-32 byte-order mark: a configuration is TOML in UTF-8 (convert it, e.g. with iconv -f UTF-16 -t UTF-8)"}
	}
	// A UTF-8 byte-order mark is allowed (the decoder skips it); the key
	// lines are found without it, so that the first header counts.
	lines, tooDeep := scanLines(string(bytes.TrimPrefix(data, []byte("\xef\xbb\xbf"))))
	if tooDeep > 0 {
		return nil, nil, &Error{File: name, Line: tooDeep, Msg: fmt.Sprintf("nested more than %d levels deep (dotted key parts, arrays and inline tables)", MaxDepth)}
	}
	var m map[string]any
	if _, err := toml.Decode(string(data), &m); err != nil {
		if pe, ok := errors.AsType[toml.ParseError](err); ok {
			// The parser's Line is one too far when the offending byte is
			// a newline; count lines up to the error's offset instead.
			line := pe.Position.Line
			if st := pe.Position.Start; st > 0 && st <= len(data) {
				line = 1 + bytes.Count(data[:st], []byte("\n"))
			}
			return nil, nil, &Error{File: name, Line: line, Key: pe.LastKey, Msg: pe.Message, err: err}
		}
		return nil, nil, &Error{File: name, Msg: err.Error(), err: err}
	}
	return m, lines, nil
}

// Validate checks c: every duration and count positive, write_chunk at least
// MinWriteChunk, min_pause <= max_pause, known enum values, stats.dir not
// empty, metrics.listen empty or host:port, watch paths absolute, existing
// directories and not duplicated. No watch at all is valid: the daemon then
// starts idle (a packaged configuration watches nothing until edited). If c came from Parse
// or Load, errors carry the file and line of the offending key (looked up
// by key name and watch index, so watches appended later simply have no
// line). The error is an *Error, or Errors for several problems (every one
// found, in file order).
func (c *Config) Validate() error {
	return c.check(true, nil)
}

// source is where a Config was parsed from: the main file's name and
// where each key was last set (see scanLines for the key syntax; a
// drop-in's [[watch]] entries are numbered after those before it).
type source struct {
	file string
	locs map[string]loc
}

// loc is where a key was set: the file, the line, the key as that file
// numbers its [[watch]] entries, and the file's place in the reading order
// (0: the main file).
type loc struct {
	file string
	line int
	key  string
	rank int
}

// loc returns where key was set. s may be nil.
func (s *source) loc(key string) (loc, bool) {
	if s == nil {
		return loc{}, false
	}
	l, ok := s.locs[key]
	return l, ok
}

// line returns the line of key, or 0. s may be nil.
func (s *source) line(key string) int {
	if s == nil {
		return 0
	}
	return s.locs[key].line
}

// Notes returns remarks on a valid configuration that the operator
// should see (check-config prints them, the daemon logs them): keys given
// under an old name. Each is "file:line: key: text".
func (c *Config) Notes() []string {
	if c.src.line("writeback.max_inflight") > 0 {
		return []string{c.src.errorf("writeback.max_inflight", "the old name of plug.max_inflight_bytes, still read: rename it").Error()}
	}
	return nil
}

// inflightKey is the key plug.max_inflight_bytes was given under: its old
// name, writeback.max_inflight, if the file used that.
func (s *source) inflightKey() string {
	if s.line("writeback.max_inflight") > 0 {
		return "writeback.max_inflight"
	}
	return "plug.max_inflight_bytes"
}

func (s *source) name() string {
	if s == nil {
		return ""
	}
	return s.file
}

func (s *source) errorf(key, format string, args ...any) *Error {
	if strings.HasPrefix(key, "-") {
		// A command-line flag's (Watch.Flag): not from the file.
		return &Error{Key: key, Msg: fmt.Sprintf(format, args...)}
	}
	if l, ok := s.loc(key); ok {
		return &Error{File: l.file, Line: l.line, Key: l.key, Msg: fmt.Sprintf(format, args...), rank: l.rank, at: key}
	}
	return &Error{File: s.name(), Key: key, Msg: fmt.Sprintf(format, args...), at: key}
}

// displayPath is a file name as errors show it: as is when it is plain
// printable text without spaces, else quoted (strconv.Quote), so that a
// newline, a NUL or blanks in it cannot garble or hide in the message.
func displayPath(p string) string {
	if q := strconv.Quote(p); p == "" || q[1:len(q)-1] != p || strings.ContainsAny(p, " \t") {
		return q
	}
	return p
}

// fileKind names the type of a file that is not a regular one.
func fileKind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	}
	return "mode " + m.String()
}

// Errors is every problem found in a configuration, in file order (lowest
// line first, keys without a line last). Its Error is one problem per
// line; errors.As finds the first *Error (Unwrap returns them all).
type Errors []*Error

func (es Errors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// Unwrap returns the errors, for errors.Is and errors.As.
func (es Errors) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}

// collect returns nil for no error, the *Error when there is one, and
// Errors in file order (the main file's, then each drop-in's; in a file,
// lowest line first, unknown lines last, keeping the order of errs among
// equals) when there are several.
func collect(errs []*Error) error {
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return errs[0]
	}
	order := func(e *Error) int {
		if e.Line <= 0 {
			return math.MaxInt
		}
		return e.Line
	}
	slices.SortStableFunc(errs, func(a, b *Error) int {
		return cmp.Or(cmp.Compare(a.rank, b.rank), cmp.Compare(order(a), order(b)))
	})
	return Errors(errs)
}
