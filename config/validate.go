package config

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

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
	// max_pause unset takes dirty_writeback_interval's value.
	maxPauseDefault := s != nil && s.line("writeback.max_pause") == 0 && wb.MaxPause == wb.DirtyWritebackInterval
	if !maxPauseDefault {
		// (A default copy's error is dirty_writeback_interval's own.)
		positive("writeback.max_pause", wb.MaxPause)
	}
	positive("writeback.attempt_timeout", wb.AttemptTimeout)
	atLeast("writeback.attempt_timeout", wb.AttemptTimeout, MinInterval)
	positive("writeback.shutdown_timeout", wb.ShutdownTimeout)
	// A max_pause copied from a dirty_writeback_interval that is itself
	// refused above is not a second error.
	knockOn := maxPauseDefault && wb.DirtyWritebackInterval < MinInterval
	if wb.MinPause > 0 && wb.MaxPause > 0 && wb.MinPause > wb.MaxPause && !knockOn {
		// Blame the key written last in the file, as that is where the
		// conflict arises; max_pause may come from dirty_writeback_interval.
		key, note := "writeback.min_pause", ""
		cands := []string{"writeback.min_pause", "writeback.max_pause"}
		if maxPauseDefault {
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
	if inflight := c.Plug.MaxInflightBytes; inflight < 0 || (inflight > 0 && inflight < MinMaxInflight) {
		add(s.inflightKey(), "must be 0 (no bound) or at least %d bytes (256KiB; no attempt writes more than the bound, and a smaller one starves writeback), got %d", MinMaxInflight, inflight)
	}
	if !wb.WriteChunkAuto && wb.WriteChunk < MinWriteChunk {
		add("writeback.write_chunk", "must be at least %d bytes (4KiB) or \"auto\", got %d", MinWriteChunk, wb.WriteChunk)
	}
	if !wb.WriteChunkAuto && wb.WriteChunk > MaxWriteChunk {
		add("writeback.write_chunk", "must be at most %d bytes (1GiB) or \"auto\", got %d", MaxWriteChunk, wb.WriteChunk)
	}
	if wb.DirtyBackgroundBytes < 0 || (wb.DirtyBackgroundBytes > 0 && wb.DirtyBackgroundBytes < MinWriteChunk) {
		add("writeback.dirty_background_bytes", "must be 0 (off) or at least %d bytes (4KiB), got %d", MinWriteChunk, wb.DirtyBackgroundBytes)
	}
	if wb.DirtyBackgroundRatio < 0 || wb.DirtyBackgroundRatio > 100 {
		add("writeback.dirty_background_ratio", "must be a percentage from 0 (off) to 100, got %d", wb.DirtyBackgroundRatio)
	}
	if wb.RangeBytes < 0 || (wb.RangeBytes > 0 && wb.RangeBytes < MinWriteChunk) {
		add("writeback.range_bytes", "must be 0 (off) or at least %d bytes (4KiB), got %d", MinWriteChunk, wb.RangeBytes)
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
	if stat && c.Stats.Dir != "" {
		// The daemon makes the directory if it is missing; something
		// else at that path is refused here, with the line, rather
		// than at start.
		var st unix.Stat_t
		if err := unix.Lstat(c.Stats.Dir, &st); err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			what := "not a directory"
			if st.Mode&unix.S_IFMT == unix.S_IFLNK {
				what = "a symbolic link, which is not accepted (name the directory it points to)"
			}
			add("stats.dir", "%q is %s", c.Stats.Dir, what)
		}
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
	resolved := make(map[string]int)   // symlinks resolved, when stat is set
	sameDir := make(map[[2]uint64]int) // (st_dev, st_ino) of the roots, when stat is set
	// ref names watch[j] with its line, for "already watched" errors.
	// statsInside reports the stats dir inside a watched tree: on
	// stats.dir where the file sets it, else on the tree's path (the
	// stats dir is then the default or --stats-dir's, and the tree's
	// line is the one to look at).
	statsInside := func(pkey, format string, args ...any) {
		if s.line("stats.dir") > 0 {
			add("stats.dir", format, args...)
			return
		}
		add(pkey, "stats.dir "+format, args...)
	}
	fromFlag := false // the entry being checked is a flag's
	ref := func(j int) string {
		if f := c.Watch[j].Flag; f != "" {
			return fmt.Sprintf("%s %q", f, c.Watch[j].Path)
		}
		r := fmt.Sprintf("watch[%d]", j)
		if l := s.line(r + ".path"); l > 0 {
			r += fmt.Sprintf(" (line %d)", l)
			if s.name() != "" && fromFlag {
				// The error names no file: the reference does.
				r = fmt.Sprintf("watch[%d] (%s:%d)", j, s.name(), l)
			}
		}
		return r
	}
	for i, w := range c.Watch {
		key := fmt.Sprintf("watch[%d]", i)
		pkey := key + ".path"
		fromFlag = w.Flag != ""
		if fromFlag {
			key, pkey = w.Flag, w.Flag
		}
		if s.line(fmt.Sprintf("watch[%d].expire", i)) > 0 || w.Expire != wb.DirtyExpireInterval {
			// (An expire taken from writeback.dirty_expire_interval
			// is that key's error, reported once, at its line.)
			positive(key+".expire", w.Expire)
		}
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
		j, dupName := seen[p]
		if dupName {
			add(pkey, "%q is already watched by %s", p, ref(j))
		} else {
			seen[p] = i
		}
		if sd := filepath.Clean(c.Stats.Dir); sd == p || strings.HasPrefix(sd, p+"/") || p == "/" {
			statsInside(pkey, "%q is inside the watched tree %q: its own stats files would keep it busy", c.Stats.Dir, p)
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
			// The path quoted, as elsewhere (it may hold a NUL or a
			// newline), then stat's reason.
			msg := err.Error()
			if pe, ok := errors.AsType[*fs.PathError](err); ok {
				msg = pe.Err.Error()
			}
			e := s.errorf(pkey, "%q: %s", p, msg)
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
					// Each path with what it resolves to, where that
					// differs.
					name := func(a, b string) string {
						if a == b {
							return strconv.Quote(a)
						}
						return fmt.Sprintf("%q (%q)", a, b)
					}
					statsInside(pkey, "%s is inside the watched tree %s: its own stats files would keep it busy", name(c.Stats.Dir, sd), name(p, r))
				}
			}
			// The same directory under another name (a symlink): it
			// would be watched twice.
			before := len(errs)
			if dupName {
				// Said already, by name.
			} else if r, err := filepath.EvalSymlinks(p); err == nil && r != p {
				if j, dup := resolved[r]; dup {
					add(pkey, "%q is %q, already watched by %s", p, r, ref(j))
				} else if j, dup := seen[r]; dup && j != i {
					add(pkey, "%q is %q, already watched by %s", p, r, ref(j))
				}
				resolved[r] = i
			} else if j, dup := resolved[p]; dup {
				add(pkey, "%q is already watched by %s, through a symlink", p, ref(j))
			}
			// The same directory through a bind mount: one inode under
			// two names, whose files' events would be reported under
			// one of them, with that tree's settings.
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				id := [2]uint64{uint64(st.Dev), uint64(st.Ino)}
				if j, dup := sameDir[id]; !dup {
					sameDir[id] = i
				} else if !dupName && len(errs) == before {
					add(pkey, "%q is the directory %s watches, under another name (a bind mount): it would be watched twice, its files reported under one name and with that tree's settings", p, ref(j))
				}
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
