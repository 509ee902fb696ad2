// Package config reads, checks and writes the flusherd configuration file.
//
// The file is TOML. Every key is optional; absent keys take the defaults
// shown below, and unknown keys are errors.
//
//	[writeback]
//	dirty_writeback_interval = "5s"   # kupdate period
//	dirty_expire_interval    = "30s"  # age at which dirty data is written back
//	min_pause        = "10ms"         # first backoff pause for b_more_io_wait
//	max_pause        = "5s"           # default: the effective dirty_writeback_interval
//	write_chunk      = "4MiB"         # most written back per inode per attempt
//	max_inflight     = "16MiB"        # writeback in flight per device before big files wait
//	requeue_blocked  = "io_wait"      # or "redirty_tail"
//	attempt_timeout  = "10s"          # a longer call counts in stuck_calls; an integrity call is given up on
//	shutdown_timeout = "30s"          # bound on the final writeback at SIGTERM
//
//	[plug]
//	enabled     = true
//	max_pending = 256                 # requests held before a forced flush
//	queue_depth = 8                   # requests in flight during a flush
//	integrity_syncfs = 64             # integrity batches of this many files of one filesystem use syncfs(2); 0: never
//
//	[watcher]
//	backend         = "auto"          # "fanotify", "inotify", or auto: fanotify when permitted
//	rescan_interval = "30s"           # rescan of directories inotify could not watch
//
//	[stats]
//	dir = "/run/flusherd"
//
//	[log]
//	level = "info"                    # debug, info, warn, error
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
// rejected as ambiguous). write_chunk must be at least 4096 bytes.
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
	"maps"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/BurntSushi/toml"
	"golang.org/x/sys/unix"
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

// Values of [Watch.Mode].
const (
	// ModeWriteback writes dirty data back without waiting for completion
	// (WB_SYNC_NONE semantics).
	ModeWriteback = "writeback"
	// ModeIntegrity writes dirty data back and waits for it (WB_SYNC_ALL
	// semantics).
	ModeIntegrity = "integrity"
)

// Log levels accepted in [Log.Level].
var logLevels = []string{"debug", "info", "warn", "error"}

// MinInterval is the shortest dirty_writeback_interval accepted (the
// kernel's dirty_writeback_centisecs counts in hundredths of a second).
const MinInterval = 10 * time.Millisecond

// MaxExpireClasses bounds the distinct expire intervals over all trees.
const MaxExpireClasses = 255

// MinWriteChunk is the smallest accepted [Writeback.WriteChunk], in bytes.
const MinWriteChunk = 4096

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
	// least MinWriteChunk. Default 4 MiB.
	WriteChunk int64
	// MaxInflight bounds the writeback in flight on one device, in bytes
	// (pages under writeback, as cachestat last saw them in the files
	// flusherd tracks): a file with more than write_chunk/4 to write
	// waits (b_more_io_wait) while this much is in flight, so a big
	// stream cannot queue ahead of a small file on a slow device (the
	// kernel's blk-wbt bounds in-flight writes for the same reason).
	// Small files always go. At least write_chunk. Default 16 MiB, or
	// write_chunk when that is larger.
	MaxInflight int64
	// RequeueBlocked is RequeueIOWait (default) or RequeueRedirtyTail.
	RequeueBlocked string
	// AttemptTimeout: a writeback attempt running longer than this counts as
	// blocked. Default 10s.
	AttemptTimeout time.Duration
	// ShutdownTimeout bounds the final writeback at SIGTERM. Default 30s.
	ShutdownTimeout time.Duration
}

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
}

// Metrics is the [metrics] table: the Prometheus endpoint.
type Metrics struct {
	// Listen is the host:port the /metrics endpoint listens on (TCP);
	// empty (default) means no endpoint.
	Listen string
}

// Watch is one [[watch]] entry: a directory tree flusherd manages.
type Watch struct {
	// Path is the directory, cleaned and absolute. Required.
	Path string
	// Recursive includes the whole tree below Path. Default true.
	Recursive bool
	// Mode is ModeWriteback (default) or ModeIntegrity.
	Mode string
	// Expire is the effective dirty_expire_interval for this tree: its own
	// expire key, or else Writeback.DirtyExpireInterval. Positive; a Watch
	// built in code (e.g. from flags) must set it.
	Expire time.Duration
}

// Error is a configuration error. Errors from Parse, Load and Validate are
// of type *Error, except I/O errors reading the file in Load.
type Error struct {
	File string // file name given to Parse or Load; "" if not from a file
	Line int    // 1-based line in File; 0 if unknown
	Key  string // dotted key, e.g. "writeback.min_pause" or "watch[1].path"; "" if none
	Msg  string // what is wrong

	err error // underlying error, if any (e.g. from os.Stat)
}

// Error formats e as "file:line: key: msg", leaving out the parts that are
// unknown (File empty, Line 0, Key empty).
func (e *Error) Error() string {
	var b strings.Builder
	switch {
	case e.File != "" && e.Line > 0:
		fmt.Fprintf(&b, "%s:%d: ", e.File, e.Line)
	case e.File != "":
		b.WriteString(e.File + ": ")
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
			MaxInflight:            16 << 20,
			RequeueBlocked:         RequeueIOWait,
			AttemptTimeout:         10 * time.Second,
			ShutdownTimeout:        30 * time.Second,
		},
		Plug:    Plug{Enabled: true, MaxPending: 256, QueueDepth: 8, IntegritySyncfs: 64},
		Watcher: Watcher{Backend: BackendAuto, RescanInterval: 30 * time.Second},
		Stats:   Stats{Dir: "/run/flusherd"},
		Log:     Log{Level: "info"},
	}
}

// Load reads the file at path and parses it with [Parse], then checks that
// every watch path exists and is a directory. A missing file gives an error
// wrapping [fs.ErrNotExist].
//
// Load does not require at least one watch, so that command-line flags can
// add watches afterwards; call [Config.Validate] on the final configuration.
func Load(path string) (*Config, error) {
	data, err := readConfigFile(path)
	if err != nil {
		return nil, err
	}
	c, err := parse(path, data)
	if err != nil {
		return nil, err
	}
	// The value and file system checks in one run: every problem is
	// reported at once.
	if err := c.check(true); err != nil {
		return nil, err
	}
	return c, nil
}

// MaxFileSize is the largest configuration file Load reads, in bytes.
const MaxFileSize = 16 << 20

// readConfigFile reads a configuration file without blocking: it is opened
// O_NONBLOCK (a FIFO does not wait for a writer) and must be a regular file
// of at most MaxFileSize bytes, so /dev/zero or a FIFO is an error, not a
// hang.
func readConfigFile(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file (%s)", path, fi.Mode().Type())
	}
	if fi.Size() > MaxFileSize {
		return nil, fmt.Errorf("%s: %d bytes; a configuration file may have at most %d", path, fi.Size(), MaxFileSize)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxFileSize {
		return nil, fmt.Errorf("%s: more than %d bytes; a configuration file may have at most %d", path, MaxFileSize, MaxFileSize)
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
// syntax error alone; else every key and type problem; else every value
// problem, in file order. For a syntax error, Key is the last key the TOML
// parser read, which may precede the error.
func Parse(name string, data []byte) (*Config, error) {
	c, err := parse(name, data)
	if err != nil {
		return nil, err
	}
	if err := c.check(false); err != nil {
		return nil, err
	}
	return c, nil
}

// parse is Parse without the value checks.
func parse(name string, data []byte) (*Config, error) {
	lines, tooDeep := scanLines(string(data))
	if tooDeep > 0 {
		return nil, &Error{File: name, Line: tooDeep, Msg: fmt.Sprintf("nested more than %d levels deep (dotted key parts, arrays and inline tables)", MaxDepth)}
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
			return nil, &Error{File: name, Line: line, Key: pe.LastKey, Msg: pe.Message, err: err}
		}
		return nil, &Error{File: name, Msg: err.Error(), err: err}
	}
	src := &source{file: name, lines: lines}
	d := &decoder{src: src}
	c := d.config(m)
	if err := collect(d.errs); err != nil {
		return nil, err
	}
	c.src = src
	return c, nil
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
	return c.check(true)
}

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
			MaxInflight:            formatSize(wb.MaxInflight),
			RequeueBlocked:         wb.RequeueBlocked,
			AttemptTimeout:         wb.AttemptTimeout.String(),
			ShutdownTimeout:        wb.ShutdownTimeout.String(),
		},
		Plug:    encPlug(c.Plug),
		Watcher: encWatcher{Backend: c.Watcher.Backend, RescanInterval: c.Watcher.RescanInterval.String()},
		Stats:   encStats(c.Stats),
		Log:     encLog(c.Log),
		Metrics: encMetrics(c.Metrics),
	}
	for _, x := range c.Watch {
		e.Watch = append(e.Watch, encWatch{Path: x.Path, Recursive: x.Recursive, Mode: x.Mode, Expire: x.Expire.String()})
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
	MaxInflight            string `toml:"max_inflight"`
	RequeueBlocked         string `toml:"requeue_blocked"`
	AttemptTimeout         string `toml:"attempt_timeout"`
	ShutdownTimeout        string `toml:"shutdown_timeout"`
}

type encPlug struct {
	Enabled         bool `toml:"enabled"`
	MaxPending      int  `toml:"max_pending"`
	QueueDepth      int  `toml:"queue_depth"`
	IntegritySyncfs int  `toml:"integrity_syncfs"`
}

type encWatcher struct {
	Backend        string `toml:"backend"`
	RescanInterval string `toml:"rescan_interval"`
}

type encStats struct {
	Dir string `toml:"dir"`
}

type encLog struct {
	Level string `toml:"level"`
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

// source is where a Config was parsed from: the file name and the line of
// each key (see scanLines for the key syntax).
type source struct {
	file  string
	lines map[string]int
}

// line returns the line of key, or 0. s may be nil.
func (s *source) line(key string) int {
	if s == nil {
		return 0
	}
	return s.lines[key]
}

func (s *source) name() string {
	if s == nil {
		return ""
	}
	return s.file
}

func (s *source) errorf(key, format string, args ...any) *Error {
	return &Error{File: s.name(), Line: s.line(key), Key: key, Msg: fmt.Sprintf(format, args...)}
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
// Errors in file order (lowest line first, unknown lines last, keeping
// the order of errs among equals) when there are several.
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
	slices.SortStableFunc(errs, func(a, b *Error) int { return cmp.Compare(order(a), order(b)) })
	return Errors(errs)
}

// check runs the value checks; stat adds the file system checks on watch
// paths.
func (c *Config) check(stat bool) error {
	s := c.src
	var errs []*Error
	add := func(key, format string, args ...any) {
		errs = append(errs, s.errorf(key, format, args...))
	}
	positive := func(key string, d time.Duration) {
		if d <= 0 {
			add(key, "must be positive, got %q", d.String())
		}
	}
	oneOf := func(key, v string, valid ...string) {
		if !slices.Contains(valid, v) {
			add(key, "unknown value %q, want %s", v, quoteList(valid))
		}
	}

	atLeast := func(key string, d, least time.Duration) {
		if d > 0 && d < least {
			add(key, "must be at least %s, got %q", least, d.String())
		}
	}
	wb := c.Writeback
	positive("writeback.dirty_writeback_interval", wb.DirtyWritebackInterval)
	atLeast("writeback.dirty_writeback_interval", wb.DirtyWritebackInterval, MinInterval)
	positive("writeback.dirty_expire_interval", wb.DirtyExpireInterval)
	positive("writeback.min_pause", wb.MinPause)
	atLeast("writeback.min_pause", wb.MinPause, time.Millisecond)
	positive("writeback.max_pause", wb.MaxPause)
	positive("writeback.attempt_timeout", wb.AttemptTimeout)
	atLeast("writeback.attempt_timeout", wb.AttemptTimeout, MinInterval)
	positive("writeback.shutdown_timeout", wb.ShutdownTimeout)
	if wb.MinPause > 0 && wb.MaxPause > 0 && wb.MinPause > wb.MaxPause {
		// Blame the key written last in the file, as that is where the
		// conflict arises; max_pause may come from dirty_writeback_interval.
		key, note := "writeback.min_pause", ""
		cands := []string{"writeback.min_pause", "writeback.max_pause"}
		if s.line("writeback.max_pause") == 0 && s != nil && wb.MaxPause == wb.DirtyWritebackInterval {
			cands = append(cands, "writeback.dirty_writeback_interval")
			note = " (max_pause defaults to dirty_writeback_interval)"
		}
		for _, k := range cands {
			if s.line(k) > s.line(key) {
				key = k
			}
		}
		add(key, "min_pause %s is greater than max_pause %s%s", wb.MinPause, wb.MaxPause, note)
	}
	if wb.MaxInflight < wb.WriteChunk {
		add("writeback.max_inflight", "must be at least write_chunk (%d bytes), got %d", wb.WriteChunk, wb.MaxInflight)
	}
	if wb.WriteChunk < MinWriteChunk {
		add("writeback.write_chunk", "must be at least %d bytes (4KiB), got %d", MinWriteChunk, wb.WriteChunk)
	}
	oneOf("writeback.requeue_blocked", wb.RequeueBlocked, RequeueIOWait, RequeueRedirtyTail)

	if c.Plug.MaxPending <= 0 {
		add("plug.max_pending", "must be positive, got %d", c.Plug.MaxPending)
	}
	if c.Plug.QueueDepth <= 0 {
		add("plug.queue_depth", "must be positive, got %d", c.Plug.QueueDepth)
	}
	if c.Plug.IntegritySyncfs < 0 {
		add("plug.integrity_syncfs", "must be 0 (never) or positive, got %d", c.Plug.IntegritySyncfs)
	}
	oneOf("watcher.backend", c.Watcher.Backend, BackendAuto, BackendFanotify, BackendInotify)
	positive("watcher.rescan_interval", c.Watcher.RescanInterval)
	atLeast("watcher.rescan_interval", c.Watcher.RescanInterval, MinInterval)
	if c.Metrics.Listen != "" {
		if err := checkListen(c.Metrics.Listen); err != nil {
			add("metrics.listen", "bad address %q: %v", c.Metrics.Listen, err)
		}
	}
	if c.Stats.Dir == "" {
		add("stats.dir", "must not be empty")
	} else if sock := filepath.Join(c.Stats.Dir, "flusherd.sock"); len(sock) > MaxSocketPath {
		// bind(2) would fail at start: the control socket's path must
		// fit in sockaddr_un's sun_path (unix(7)).
		add("stats.dir", "%q is too long: the control socket %q would be %d bytes, and a unix socket path holds at most %d",
			c.Stats.Dir, sock, len(sock), MaxSocketPath)
	}
	expires := map[time.Duration]bool{wb.DirtyExpireInterval: true}
	for _, w := range c.Watch {
		expires[w.Expire] = true
	}
	if len(expires) > MaxExpireClasses {
		add("watch", "%d distinct expire intervals; at most %d are supported", len(expires), MaxExpireClasses)
	}
	oneOf("log.level", c.Log.Level, logLevels...)

	seen := make(map[string]int)
	resolved := make(map[string]int) // symlinks resolved, when stat is set
	// ref names watch[j] with its line, for "already watched" errors.
	ref := func(j int) string {
		r := fmt.Sprintf("watch[%d]", j)
		if l := s.line(r + ".path"); l > 0 {
			r += fmt.Sprintf(" (line %d)", l)
		}
		return r
	}
	for i, w := range c.Watch {
		key := fmt.Sprintf("watch[%d]", i)
		pkey := key + ".path"
		positive(key+".expire", w.Expire)
		oneOf(key+".mode", w.Mode, ModeWriteback, ModeIntegrity)
		switch {
		case w.Path == "":
			add(pkey, "must not be empty")
			continue
		case !filepath.IsAbs(w.Path):
			add(pkey, "%q is not an absolute path", w.Path)
			continue
		}
		p := filepath.Clean(w.Path)
		if j, dup := seen[p]; dup {
			add(pkey, "%q is already watched by %s", p, ref(j))
		} else {
			seen[p] = i
		}
		if sd := filepath.Clean(c.Stats.Dir); sd == p || strings.HasPrefix(sd, p+"/") || p == "/" {
			add("stats.dir", "%q is inside the watched tree %q: its own stats files would keep it busy", c.Stats.Dir, p)
		}
		if !stat {
			continue
		}
		fi, err := os.Stat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			e := s.errorf(pkey, "%q does not exist", p)
			e.err = err
			errs = append(errs, e)
		case err != nil:
			e := s.errorf(pkey, "%v", err)
			e.err = err
			errs = append(errs, e)
		case !fi.IsDir():
			add(pkey, "%q is not a directory", p)
		case onOverlay(p):
			// Refused, not silently unserved: an overlay file's page
			// cache is its upper layer's, which cachestat(2) and
			// sync_file_range(2) on the overlay's descriptor do not see.
			add(pkey, "%q is on overlayfs: cachestat and sync_file_range on its files see the overlay's own (empty) page cache, not the upper layer's, so its dirty data could not be found or written; watch the upper layer's directory (upperdir= in the overlay's mount options) instead", p)
		default:
			// The stats directory inside the tree through a symlink
			// (of either path): its own writes would keep the daemon
			// busy.
			if r, err := filepath.EvalSymlinks(p); err == nil {
				if sd, err := evalExisting(c.Stats.Dir); err == nil && (sd == r || strings.HasPrefix(sd, r+"/") || r == "/") &&
					!(c.Stats.Dir == p || strings.HasPrefix(filepath.Clean(c.Stats.Dir), p+"/") || p == "/") {
					add("stats.dir", "%q is %q, inside the watched tree %q (%q): its own stats files would keep it busy", c.Stats.Dir, sd, p, r)
				}
			}
			// The same directory under another name (a symlink): it
			// would be watched twice.
			if r, err := filepath.EvalSymlinks(p); err == nil && r != p {
				if j, dup := resolved[r]; dup {
					add(pkey, "%q is %q, already watched by %s", p, r, ref(j))
				} else if j, dup := seen[r]; dup && j != i {
					add(pkey, "%q is %q, already watched by %s", p, r, ref(j))
				}
				resolved[r] = i
			} else if j, dup := resolved[p]; dup {
				add(pkey, "%q is already watched by %s, through a symlink", p, ref(j))
			}
		}
	}
	return collect(errs)
}

// onOverlay reports whether dir is on an overlay filesystem (statfs(2)
// f_type OVERLAYFS_SUPER_MAGIC).
func onOverlay(dir string) bool {
	var fs unix.Statfs_t
	return unix.Statfs(dir, &fs) == nil && fs.Type == unix.OVERLAYFS_SUPER_MAGIC
}

// evalExisting is filepath.EvalSymlinks for a path that may not exist yet
// (a stats directory the daemon will make): the symlinks of its deepest
// existing ancestor are resolved and the rest appended.
func evalExisting(p string) (string, error) {
	p = filepath.Clean(p)
	var rest []string
	for {
		r, err := filepath.EvalSymlinks(p)
		if err == nil {
			return filepath.Join(append([]string{r}, rest...)...), nil
		}
		if !errors.Is(err, fs.ErrNotExist) || filepath.Dir(p) == p {
			return "", err
		}
		rest = append([]string{filepath.Base(p)}, rest...)
		p = filepath.Dir(p)
	}
}

// checkListen checks a listen address: host:port with a numeric port from
// 1 to 65535 (the host is resolved only when listening).
func checkListen(addr string) error {
	const want = `want host:port, e.g. "127.0.0.1:9469" (an empty host listens on every address)`
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		if ae, ok := errors.AsType[*net.AddrError](err); ok {
			return fmt.Errorf("%s: %s", ae.Err, want)
		}
		return fmt.Errorf("%v: %s", err, want)
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 {
		return fmt.Errorf("port %q is not a number from 1 to 65535", port)
	}
	return nil
}

func quoteList(vs []string) string {
	q := make([]string, len(vs))
	for i, v := range vs {
		q[i] = strconv.Quote(v)
	}
	if len(q) <= 2 {
		return strings.Join(q, " or ")
	}
	return strings.Join(q[:len(q)-1], ", ") + " or " + q[len(q)-1]
}

// decoder turns the generic TOML tree into a Config, collecting errors.
type decoder struct {
	src  *source
	errs []*Error
}

func (d *decoder) errorf(key, format string, args ...any) {
	d.errs = append(d.errs, d.src.errorf(key, format, args...))
}

// field decodes one key's value; key is the full dotted key.
type field func(key string, v any)

// table decodes the keys of table m (at dotted key prefix) with fields,
// reporting unknown keys.
func (d *decoder) table(prefix string, v any, fields map[string]field) {
	m, ok := v.(map[string]any)
	if !ok {
		d.errorf(prefix, "want a table, got %s", describe(v))
		return
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		key := joinKey(prefix, k)
		f, ok := fields[k]
		if !ok {
			d.errorf(key, "unknown key, want one of %s", strings.Join(slices.Sorted(maps.Keys(fields)), ", "))
			continue
		}
		f(key, m[k])
	}
}

func (d *decoder) config(m map[string]any) *Config {
	c := Default()
	wb := &c.Writeback
	maxPauseSet, maxInflightSet := false, false
	var watches []any
	d.table("", m, map[string]field{
		"writeback": func(key string, v any) {
			d.table(key, v, map[string]field{
				"dirty_writeback_interval": d.duration(&wb.DirtyWritebackInterval),
				"dirty_expire_interval":    d.duration(&wb.DirtyExpireInterval),
				"min_pause":                d.duration(&wb.MinPause),
				"max_pause": func(key string, v any) {
					maxPauseSet = true
					d.duration(&wb.MaxPause)(key, v)
				},
				"write_chunk": d.size(&wb.WriteChunk),
				"max_inflight": func(key string, v any) {
					maxInflightSet = true
					d.size(&wb.MaxInflight)(key, v)
				},
				"requeue_blocked":  d.str(&wb.RequeueBlocked),
				"attempt_timeout":  d.duration(&wb.AttemptTimeout),
				"shutdown_timeout": d.duration(&wb.ShutdownTimeout),
			})
		},
		"plug": func(key string, v any) {
			d.table(key, v, map[string]field{
				"enabled":          d.boolean(&c.Plug.Enabled),
				"max_pending":      d.integer(&c.Plug.MaxPending),
				"queue_depth":      d.integer(&c.Plug.QueueDepth),
				"integrity_syncfs": d.integer(&c.Plug.IntegritySyncfs),
			})
		},
		"watcher": func(key string, v any) {
			d.table(key, v, map[string]field{
				"backend":         d.str(&c.Watcher.Backend),
				"rescan_interval": d.duration(&c.Watcher.RescanInterval),
			})
		},
		"stats": func(key string, v any) {
			d.table(key, v, map[string]field{"dir": d.str(&c.Stats.Dir)})
		},
		"log": func(key string, v any) {
			d.table(key, v, map[string]field{"level": d.str(&c.Log.Level)})
		},
		"metrics": func(key string, v any) {
			d.table(key, v, map[string]field{"listen": d.str(&c.Metrics.Listen)})
		},
		"watch": func(key string, v any) {
			switch v := v.(type) {
			case []map[string]any:
				for _, x := range v {
					watches = append(watches, x)
				}
			case []any:
				watches = v
			default:
				d.errorf(key, "want an array of tables ([[watch]]), got %s", describe(v))
			}
		},
	})
	if !maxPauseSet {
		wb.MaxPause = wb.DirtyWritebackInterval
	}
	if !maxInflightSet {
		// The default follows a larger write_chunk.
		wb.MaxInflight = max(wb.MaxInflight, wb.WriteChunk)
	}
	for i, v := range watches {
		key := fmt.Sprintf("watch[%d]", i)
		w := Watch{Recursive: true, Mode: ModeWriteback, Expire: wb.DirtyExpireInterval}
		pathSet := false
		d.table(key, v, map[string]field{
			"path": func(key string, v any) {
				pathSet = true
				d.str(&w.Path)(key, v)
			},
			"recursive": d.boolean(&w.Recursive),
			"mode":      d.str(&w.Mode),
			"expire":    d.duration(&w.Expire),
		})
		switch {
		case !pathSet:
			if _, isTable := v.(map[string]any); isTable {
				e := d.src.errorf(key+".path", "missing: every [[watch]] needs a path")
				e.Line = d.src.line(key)
				d.errs = append(d.errs, e)
			}
		case w.Path == "":
			d.errorf(key+".path", "must not be empty")
		default:
			abs, err := filepath.Abs(w.Path)
			if err != nil {
				d.errorf(key+".path", "cannot make %q absolute: %v", w.Path, err)
			}
			w.Path = abs
		}
		c.Watch = append(c.Watch, w)
	}
	return c
}

func (d *decoder) duration(dst *time.Duration) field {
	return func(key string, v any) {
		s, ok := v.(string)
		if !ok {
			switch v.(type) {
			case int64, float64:
				d.errorf(key, "bad duration %v: a duration must be a string with a unit, e.g. \"%vs\"", v, v)
			default:
				d.errorf(key, "want a duration string like \"5s\", got %s", describe(v))
			}
			return
		}
		if _, err := strconv.ParseFloat(strings.TrimSpace(s), 64); err == nil {
			d.errorf(key, "bad duration %q: a duration needs a unit, e.g. \"%sms\"", s, strings.TrimSpace(s))
			return
		}
		x, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil {
			d.errorf(key, "bad duration %q: want a number with a unit (ns, us, ms, s, m, h), e.g. \"5s\" or \"1m30s\"", s)
			return
		}
		*dst = x
	}
}

func (d *decoder) size(dst *int64) field {
	return func(key string, v any) {
		switch v := v.(type) {
		case int64:
			*dst = v
		case string:
			n, err := parseSize(v)
			if err != nil {
				d.errorf(key, "bad size %q: %v", v, err)
				return
			}
			*dst = n
		default:
			d.errorf(key, "want a size like \"4MiB\" or an integer number of bytes, got %s", describe(v))
		}
	}
}

func (d *decoder) str(dst *string) field {
	return func(key string, v any) {
		s, ok := v.(string)
		if !ok {
			d.errorf(key, "want a string, got %s", describe(v))
			return
		}
		*dst = s
	}
}

func (d *decoder) boolean(dst *bool) field {
	return func(key string, v any) {
		b, ok := v.(bool)
		if !ok {
			d.errorf(key, "want true or false, got %s", describe(v))
			return
		}
		*dst = b
	}
}

func (d *decoder) integer(dst *int) field {
	return func(key string, v any) {
		n, ok := v.(int64)
		if !ok {
			d.errorf(key, "want an integer, got %s", describe(v))
			return
		}
		if int64(int(n)) != n {
			d.errorf(key, "%d is out of range", n)
			return
		}
		*dst = int(n)
	}
}

// describe names a decoded TOML value's type (and value, if scalar) for
// error messages.
func describe(v any) string {
	switch v := v.(type) {
	case string:
		return fmt.Sprintf("string %q", v)
	case int64:
		return fmt.Sprintf("integer %d", v)
	case float64:
		return fmt.Sprintf("float %v", v)
	case bool:
		return fmt.Sprintf("boolean %v", v)
	case map[string]any:
		return "a table"
	case []map[string]any, []any:
		return "an array"
	case time.Time:
		return "a datetime"
	default:
		return fmt.Sprintf("a %T", v)
	}
}

var sizeUnits = map[string]int64{
	"": 1, "B": 1,
	"K": 1 << 10, "KiB": 1 << 10,
	"M": 1 << 20, "MiB": 1 << 20,
	"G": 1 << 30, "GiB": 1 << 30,
}

// parseSize parses a whole number of bytes with an optional binary unit
// (see the package documentation).
func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	j := 0
	for j < len(t) && '0' <= t[j] && t[j] <= '9' {
		j++
	}
	if j == 0 {
		return 0, errors.New(`want a whole number with an optional unit B, KiB, MiB or GiB, e.g. "4MiB"`)
	}
	unit := strings.TrimSpace(t[j:])
	mult, ok := sizeUnits[unit]
	switch {
	case ok:
	case strings.HasPrefix(unit, "."):
		return 0, errors.New(`fractions are not allowed: write a whole number, in a smaller unit if need be ("1536KiB", not "1.5MiB")`)
	case slices.Contains([]string{"kB", "KB", "MB", "GB", "kb", "mb", "gb"}, unit):
		return 0, fmt.Errorf("ambiguous unit %q (powers of 1000 or of 1024?): write KiB, MiB or GiB (powers of 1024), or a number of bytes", unit)
	default:
		return 0, fmt.Errorf("unknown unit %q, want B, KiB, MiB or GiB (K, M, G also mean KiB, MiB, GiB)", unit)
	}
	n, err := strconv.ParseInt(t[:j], 10, 64)
	if err != nil || n > math.MaxInt64/mult {
		return 0, errors.New("too large")
	}
	return n * mult, nil
}

// formatSize writes n bytes with the largest binary unit that divides it.
func formatSize(n int64) string {
	for _, u := range []struct {
		name string
		mult int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.mult == 0 {
			return strconv.FormatInt(n/u.mult, 10) + u.name
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}

// joinKey appends the TOML key part k to the dotted key prefix, quoting k
// unless it is a bare key.
func joinKey(prefix, k string) string {
	if !isBareKey(k) {
		k = strconv.Quote(k)
	}
	if prefix == "" {
		return k
	}
	return prefix + "." + k
}

func isBareKey(k string) bool {
	if k == "" {
		return false
	}
	for _, r := range k {
		if !isBareChar(r) {
			return false
		}
	}
	return true
}

func isBareChar(r rune) bool {
	return 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '_' || r == '-'
}

// scanLines maps every key of a TOML document to the line it is defined on.
//
// BurntSushi/toml records key positions internally but does not export them
// (and keeps only one position per key for all [[array]] entries), so this
// is a small scanner for documents the TOML parser has already accepted. Keys
// are dotted as by joinKey; entries of arrays (of tables, or inline) get a
// 0-based index: "watch[1]" is the second [[watch]] header and
// "watch[1].path" the path key under it. A table defined only implicitly
// (by a dotted key or a sub-table header) maps to the line of its first use.
//
// It runs before the TOML parser, so it never fails on a document the
// parser would refuse: it skips what it does not understand. A key or value
// nested deeper than MaxDepth stops it; tooDeep then gives that line (the
// parser's recursion, and marking every level, would take memory and time
// that grow with the depth's square: an 80 KB file of nested arrays took
// 4 GB).
func scanLines(src string) (lines map[string]int, tooDeep int) {
	sc := &scanner{s: src, line: 1, lines: make(map[string]int), arrays: make(map[string]int)}
	sc.document()
	return sc.lines, sc.tooDeep
}

// MaxDepth is the deepest nesting a configuration may have: the parts of a
// dotted key plus the arrays and inline tables its value is nested in. The
// schema needs 3 ("watch[1].path").
const MaxDepth = 32

type scanner struct {
	s       string
	i       int
	line    int
	lines   map[string]int
	arrays  map[string]int // array-of-tables key → entries seen so far
	depth   int            // nesting of the key or value being read
	tooDeep int            // line where nesting passed MaxDepth; 0 if none
}

// deeper enters one more level of nesting; past MaxDepth it records the
// line and ends the scan (the rest of the input is skipped).
func (sc *scanner) deeper() bool {
	sc.depth++
	if sc.depth <= MaxDepth {
		return true
	}
	if sc.tooDeep == 0 {
		sc.tooDeep = sc.line
	}
	sc.i = len(sc.s)
	return false
}

func (sc *scanner) eof() bool { return sc.i >= len(sc.s) }

func (sc *scanner) peek(off int) byte {
	if sc.i+off < len(sc.s) {
		return sc.s[sc.i+off]
	}
	return 0
}

func (sc *scanner) advance(n int) {
	for ; n > 0 && !sc.eof(); n-- {
		if sc.s[sc.i] == '\n' {
			sc.line++
		}
		sc.i++
	}
}

// maxMarkedKey bounds the keys the scanner records and builds: a longer
// one (no key of the schema is) has no line in errors, and memory stays
// linear in the input.
const maxMarkedKey = 1 << 10

// join is joinKey, except that a key past maxMarkedKey is not extended.
func (sc *scanner) join(prefix, k string) string {
	if len(prefix) > maxMarkedKey {
		return prefix
	}
	return joinKey(prefix, k)
}

func (sc *scanner) mark(key string, line int) {
	if len(key) > maxMarkedKey {
		return
	}
	if _, ok := sc.lines[key]; !ok {
		sc.lines[key] = line
	}
}

// skipSpace skips blanks and, if nl, newlines and comments too.
func (sc *scanner) skipSpace(nl bool) {
	for !sc.eof() {
		switch c := sc.peek(0); {
		case c == ' ' || c == '\t':
		case nl && (c == '\n' || c == '\r'):
		case nl && c == '#':
			for !sc.eof() && sc.peek(0) != '\n' {
				sc.advance(1)
			}
			continue
		default:
			return
		}
		sc.advance(1)
	}
}

func (sc *scanner) skipLine() {
	for !sc.eof() && sc.peek(0) != '\n' {
		sc.advance(1)
	}
}

func (sc *scanner) document() {
	table := ""
	for {
		sc.skipSpace(true)
		if sc.eof() {
			return
		}
		line := sc.line
		if sc.peek(0) != '[' {
			sc.keyval(table)
			sc.skipLine() // trailing blanks and comment
			continue
		}
		array := sc.peek(1) == '['
		if array {
			sc.advance(2)
		} else {
			sc.advance(1)
		}
		parts := sc.keyParts()
		sc.skipLine()
		// Resolve the header: a prefix naming an array of tables refers
		// to its last entry.
		table = ""
		for n, k := range parts {
			table = sc.join(table, k)
			sc.mark(table, line)
			if array && n == len(parts)-1 {
				idx := sc.arrays[table]
				sc.arrays[table] = idx + 1
				table = sc.index(table, idx)
				sc.mark(table, line)
			} else if cnt, ok := sc.arrays[table]; ok {
				table = sc.index(table, cnt-1)
			}
		}
	}
}

// index is key's n-th entry, "key[n]", except that a key past
// maxMarkedKey is not extended.
func (sc *scanner) index(key string, n int) string {
	if len(key) > maxMarkedKey {
		return key
	}
	return key + "[" + strconv.Itoa(n) + "]"
}

// keyParts reads a possibly dotted, possibly quoted key, of at most
// MaxDepth parts less the nesting it is in.
func (sc *scanner) keyParts() []string {
	var parts []string
	for {
		if len(parts)+sc.depth >= MaxDepth {
			if sc.tooDeep == 0 {
				sc.tooDeep = sc.line
			}
			sc.i = len(sc.s)
			return parts
		}
		sc.skipSpace(false)
		var k string
		switch c := sc.peek(0); {
		case c == '"':
			start := sc.i
			sc.basicString()
			raw := sc.s[start:sc.i]
			if u, err := strconv.Unquote(raw); err == nil {
				k = u
			} else {
				k = strings.Trim(raw, `"`)
			}
		case c == '\'':
			start := sc.i + 1
			sc.literalString()
			k = strings.TrimSuffix(sc.s[start:sc.i], "'")
		default:
			start := sc.i // a bare key; tolerate non-ASCII letters
			for !sc.eof() && !strings.ContainsRune(" \t=.[]{},\"'#\r\n", rune(sc.peek(0))) {
				sc.advance(1)
			}
			if sc.i == start {
				return parts
			}
			k = sc.s[start:sc.i]
		}
		parts = append(parts, k)
		sc.skipSpace(false)
		if sc.peek(0) != '.' {
			return parts
		}
		sc.advance(1)
	}
}

// keyval reads "key = value" in table prefix. The key's parts count
// towards the nesting of its value.
func (sc *scanner) keyval(prefix string) {
	line := sc.line
	key := prefix
	parts := sc.keyParts()
	for _, k := range parts {
		key = sc.join(key, k)
		sc.mark(key, line)
	}
	sc.skipSpace(false)
	if sc.peek(0) != '=' {
		sc.advance(1) // not TOML; make progress
		return
	}
	sc.advance(1)
	sc.skipSpace(false)
	sc.depth += len(parts)
	sc.value(key)
	sc.depth -= len(parts)
}

func (sc *scanner) value(key string) {
	switch sc.peek(0) {
	case '"':
		sc.basicString()
	case '\'':
		sc.literalString()
	case '[':
		if !sc.deeper() {
			return
		}
		defer func() { sc.depth-- }()
		sc.advance(1)
		for n := 0; ; n++ {
			sc.skipSpace(true)
			if sc.eof() || sc.peek(0) == ']' {
				sc.advance(1)
				return
			}
			elem := sc.index(key, n)
			sc.mark(elem, sc.line)
			start := sc.i
			sc.value(elem)
			sc.skipSpace(true)
			if sc.peek(0) == ',' || sc.i == start {
				sc.advance(1)
			}
		}
	case '{':
		if !sc.deeper() {
			return
		}
		defer func() { sc.depth-- }()
		sc.advance(1)
		for {
			sc.skipSpace(true)
			if sc.eof() || sc.peek(0) == '}' {
				sc.advance(1)
				return
			}
			start := sc.i
			sc.keyval(key)
			sc.skipSpace(true)
			if sc.peek(0) == ',' || sc.i == start {
				sc.advance(1)
			}
		}
	default: // number, boolean, date-time (which may contain a space)
		for !sc.eof() && !strings.ContainsRune(",]}#\r\n", rune(sc.peek(0))) {
			sc.advance(1)
		}
	}
}

// basicString skips a basic string, single- or multi-line.
func (sc *scanner) basicString() {
	if strings.HasPrefix(sc.s[sc.i:], `"""`) {
		sc.advance(3)
		for !sc.eof() {
			switch {
			case sc.peek(0) == '\\':
				sc.advance(2)
			case strings.HasPrefix(sc.s[sc.i:], `"""`):
				sc.advance(3)
				for range 2 { // up to two quotes may end the content
					if sc.peek(0) == '"' {
						sc.advance(1)
					}
				}
				return
			default:
				sc.advance(1)
			}
		}
		return
	}
	sc.advance(1)
	for !sc.eof() {
		switch sc.peek(0) {
		case '\\':
			sc.advance(2)
		case '"':
			sc.advance(1)
			return
		case '\n':
			return
		default:
			sc.advance(1)
		}
	}
}

// literalString skips a literal string, single- or multi-line.
func (sc *scanner) literalString() {
	if strings.HasPrefix(sc.s[sc.i:], "'''") {
		sc.advance(3)
		end := strings.Index(sc.s[sc.i:], "'''")
		if end < 0 {
			sc.advance(len(sc.s))
			return
		}
		sc.advance(end + 3)
		for range 2 {
			if sc.peek(0) == '\'' {
				sc.advance(1)
			}
		}
		return
	}
	sc.advance(1)
	for !sc.eof() && sc.peek(0) != '\'' && sc.peek(0) != '\n' {
		sc.advance(1)
	}
	sc.advance(1)
}
