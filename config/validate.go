package config

import (
	"cmp"
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

	"flusherd/tree"
)

// check runs the value checks; stat adds the file system checks on watch
// paths. Errors come in the order of the steps, each step's in its keys'
// order.
func (c *Config) check(stat bool, decodeErrs []*Error) error {
	ch := &checker{c: c, s: c.src, stat: stat, errs: slices.Clone(decodeErrs)}
	for _, e := range decodeErrs {
		if ch.decoded == nil {
			ch.decoded = map[string]bool{}
		}
		ch.decoded[e.at] = true
	}
	ch.writebackTimes()
	ch.writebackSizes()
	ch.plug()
	ch.watcher()
	ch.metricsAndStats()
	ch.expireClasses()
	ch.oneOf("log.level", c.Log.Level, LogLevels...)
	ch.oneOf("log.format", c.Log.Format, LogFormats...)
	ch.trees()
	return collect(ch.errs)
}

// checker collects the errors of Config.check.
type checker struct {
	c    *Config
	s    *source
	stat bool // check the watch paths and stats.dir on the file system
	errs []*Error
	// decoded holds the keys that had a key or type problem: left at
	// their defaults, they are not checked again.
	decoded map[string]bool

	// Of the watch entries checked so far (trees): the index of each
	// cleaned path, of each path's symlinks resolved (when stat is set),
	// and of each root's (st_dev, st_ino) (when stat is set).
	seen, resolved map[string]int
	sameDir        map[[2]uint64]int
	fromFlag       bool // the entry being checked is a flag's
}

func (ch *checker) add(key, format string, args ...any) {
	if ch.decoded[key] {
		return
	}
	ch.errs = append(ch.errs, ch.s.errorf(key, format, args...))
}

func (ch *checker) positive(key string, d time.Duration) {
	if d <= 0 {
		ch.add(key, "must be positive, got %q", d.String())
	}
}

func (ch *checker) oneOf(key, v string, valid ...string) {
	if !slices.Contains(valid, v) {
		ch.add(key, "unknown value %q, want %s", v, quoteList(valid))
	}
}

func (ch *checker) atLeast(key string, d, least time.Duration) {
	if d > 0 && d < least {
		ch.add(key, "must be at least %s, got %q", least, d.String())
	}
}

// writebackTimes checks the writeback intervals, pauses and timeouts.
func (ch *checker) writebackTimes() {
	s, wb := ch.s, ch.c.Writeback
	ch.positive("writeback.dirty_writeback_interval", wb.DirtyWritebackInterval)
	ch.atLeast("writeback.dirty_writeback_interval", wb.DirtyWritebackInterval, MinInterval)
	ch.positive("writeback.dirty_expire_interval", wb.DirtyExpireInterval)
	ch.positive("writeback.min_pause", wb.MinPause)
	ch.atLeast("writeback.min_pause", wb.MinPause, time.Millisecond)
	// max_pause unset takes dirty_writeback_interval's value.
	maxPauseDefault := s != nil && s.line("writeback.max_pause") == 0 && wb.MaxPause == wb.DirtyWritebackInterval
	if !maxPauseDefault {
		// (A default copy's error is dirty_writeback_interval's own.)
		ch.positive("writeback.max_pause", wb.MaxPause)
	}
	ch.positive("writeback.attempt_timeout", wb.AttemptTimeout)
	ch.atLeast("writeback.attempt_timeout", wb.AttemptTimeout, MinInterval)
	ch.positive("writeback.shutdown_timeout", wb.ShutdownTimeout)
	if wb.TargetLatency < 0 || (wb.TargetLatency > 0 && wb.TargetLatency < time.Millisecond) {
		ch.add("writeback.target_latency", "must be 0 (off: max_inflight_bytes in flight) or at least 1ms, got %v", wb.TargetLatency)
	}
	if wb.MaxTrackedInodes < MaxTrackedUnlimited {
		ch.add("writeback.max_tracked_inodes", "must be a count of at least 1, \"auto\" or \"unlimited\", got %d", wb.MaxTrackedInodes)
	}
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
		ch.add(key, "min_pause %s is greater than max_pause %s%s", wb.MinPause, wb.MaxPause, note)
	}
}

// writebackSizes checks the in-flight bound (plug.max_inflight_bytes, or
// its old name writeback.max_inflight), the writeback sizes and
// requeue_blocked.
func (ch *checker) writebackSizes() {
	wb := ch.c.Writeback
	if inflight := ch.c.Plug.MaxInflightBytes; inflight < 0 || (inflight > 0 && inflight < MinMaxInflight) {
		ch.add(ch.s.inflightKey(), "must be 0 (no bound) or at least %d bytes (256KiB; no attempt writes more than the bound, and a smaller one starves writeback), got %d", MinMaxInflight, inflight)
	}
	if !wb.WriteChunkAuto && wb.WriteChunk < MinWriteChunk {
		ch.add("writeback.write_chunk", "must be at least %d bytes (4KiB) or \"auto\", got %d", MinWriteChunk, wb.WriteChunk)
	}
	if !wb.WriteChunkAuto && wb.WriteChunk > MaxWriteChunk {
		ch.add("writeback.write_chunk", "must be at most %d bytes (1GiB) or \"auto\", got %d", MaxWriteChunk, wb.WriteChunk)
	}
	if wb.DirtyBackgroundBytes < 0 || (wb.DirtyBackgroundBytes > 0 && wb.DirtyBackgroundBytes < MinWriteChunk) {
		ch.add("writeback.dirty_background_bytes", "must be 0 (off) or at least %d bytes (4KiB), got %d", MinWriteChunk, wb.DirtyBackgroundBytes)
	}
	if wb.DirtyBackgroundRatio < 0 || wb.DirtyBackgroundRatio > 100 {
		ch.add("writeback.dirty_background_ratio", "must be a percentage from 0 (off) to 100, got %d", wb.DirtyBackgroundRatio)
	}
	if wb.RangeBytes < 0 || (wb.RangeBytes > 0 && wb.RangeBytes < MinWriteChunk) {
		ch.add("writeback.range_bytes", "must be 0 (off) or at least %d bytes (4KiB), got %d", MinWriteChunk, wb.RangeBytes)
	}
	ch.oneOf("writeback.requeue_blocked", wb.RequeueBlocked, RequeueIOWait, RequeueRedirtyTail)
}

// plug checks the [plug] keys but max_inflight_bytes (writebackSizes).
func (ch *checker) plug() {
	p := ch.c.Plug
	if p.MaxPending <= 0 {
		ch.add("plug.max_pending", "must be positive, got %d", p.MaxPending)
	}
	if p.QueueDepth <= 0 {
		ch.add("plug.queue_depth", "must be positive, got %d", p.QueueDepth)
	}
	if p.IntegritySyncfs < 0 {
		ch.add("plug.integrity_syncfs", "must be 0 (never) or positive, got %d", p.IntegritySyncfs)
	}
}

// watcher checks the [watcher] keys.
func (ch *checker) watcher() {
	w := ch.c.Watcher
	ch.oneOf("watcher.backend", w.Backend, BackendAuto, BackendFanotify, BackendInotify)
	ch.positive("watcher.rescan_interval", w.RescanInterval)
	ch.atLeast("watcher.rescan_interval", w.RescanInterval, MinInterval)
	if !w.SweepAuto && w.SweepInterval != 0 {
		ch.positive("watcher.sweep_interval", w.SweepInterval)
		ch.atLeast("watcher.sweep_interval", w.SweepInterval, MinInterval)
	}
}

// metricsAndStats checks metrics.listen and stats.dir (on the file system
// too, when stat is set).
func (ch *checker) metricsAndStats() {
	c := ch.c
	if c.Metrics.Listen != "" {
		if err := checkListen(c.Metrics.Listen); err != nil {
			ch.add("metrics.listen", "bad address %q: %v", c.Metrics.Listen, err)
		}
	}
	if c.Stats.Dir == "" {
		ch.add("stats.dir", "must not be empty")
	} else if sock := filepath.Join(c.Stats.Dir, "flusherd.sock"); len(sock) > MaxSocketPath {
		// bind(2) would fail at start: the control socket's path must
		// fit in sockaddr_un's sun_path (unix(7)).
		ch.add("stats.dir", "%q is too long: the control socket %q would be %d bytes, and a unix socket path holds at most %d",
			c.Stats.Dir, sock, len(sock), MaxSocketPath)
	}
	if ch.stat && c.Stats.Dir != "" {
		// The daemon makes the directory if it is missing; something
		// else at that path is refused here, with the line, rather
		// than at start.
		var st unix.Stat_t
		if err := unix.Lstat(c.Stats.Dir, &st); err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			what := "not a directory"
			if st.Mode&unix.S_IFMT == unix.S_IFLNK {
				what = "a symbolic link, which is not accepted (name the directory it points to)"
			}
			ch.add("stats.dir", "%q is %s", c.Stats.Dir, what)
		}
	}
}

// expireClasses checks the number of distinct expire intervals.
func (ch *checker) expireClasses() {
	expires := map[time.Duration]bool{ch.c.Writeback.DirtyExpireInterval: true}
	for _, w := range ch.c.Watch {
		expires[w.Expire] = true
	}
	if len(expires) > MaxExpireClasses {
		ch.add("watch", "%d distinct expire intervals; at most %d are supported", len(expires), MaxExpireClasses)
	}
}

// trees checks the [[watch]] entries, in order: their keys, their paths,
// and (when stat is set) what is at each path.
func (ch *checker) trees() {
	ch.seen = make(map[string]int)
	ch.resolved = make(map[string]int)
	ch.sameDir = make(map[[2]uint64]int)
	for i, w := range ch.c.Watch {
		ch.tree(i, w)
	}
}

// ref names watch[j] with its line, for "already watched" errors.
func (ch *checker) ref(j, from int) string {
	s := ch.s
	if f := ch.c.Watch[j].Flag; f != "" {
		return fmt.Sprintf("%s %q", f, ch.c.Watch[j].Root)
	}
	r := fmt.Sprintf("watch[%d]", j)
	l, ok := s.loc(r + ".path")
	if !ok || l.line == 0 {
		return r
	}
	here, _ := s.loc(fmt.Sprintf("watch[%d].path", from))
	switch {
	case ch.fromFlag || l.file != here.file:
		// The error names no file, or another: the reference does,
		// with the entry as that file numbers it.
		return fmt.Sprintf("%s (%s:%d)", strings.TrimSuffix(l.key, ".path"), displayPath(cmp.Or(l.file, s.name())), l.line)
	}
	return r + fmt.Sprintf(" (line %d)", l.line)
}

// statsInside reports the stats dir inside a watched tree: on stats.dir
// where the file sets it, else on the tree's path (the stats dir is then
// the default or --stats-dir's, and the tree's line is the one to look
// at).
func (ch *checker) statsInside(pkey, format string, args ...any) {
	if ch.s.line("stats.dir") > 0 {
		ch.add("stats.dir", format, args...)
		return
	}
	ch.add(pkey, "stats.dir "+format, args...)
}

// tree checks watch entry i, w.
func (ch *checker) tree(i int, w Watch) {
	c := ch.c
	key := fmt.Sprintf("watch[%d]", i)
	pkey := key + ".path"
	ch.fromFlag = w.Flag != ""
	if ch.fromFlag {
		key, pkey = w.Flag, w.Flag
	}
	if ch.s.line(fmt.Sprintf("watch[%d].expire", i)) > 0 || w.Expire != c.Writeback.DirtyExpireInterval {
		// (An expire taken from writeback.dirty_expire_interval
		// is that key's error, reported once, at its line.)
		ch.positive(key+".expire", w.Expire)
	}
	ch.oneOf(key+".mode", string(w.Mode), string(tree.ModeWriteback), string(tree.ModeIntegrity))
	switch {
	case w.Root == "":
		ch.add(pkey, "must not be empty")
		return
	case !filepath.IsAbs(w.Root):
		ch.add(pkey, "%q is not an absolute path", w.Root)
		return
	}
	p := filepath.Clean(w.Root)
	j, dupName := ch.seen[p]
	if dupName {
		ch.add(pkey, "%q is already watched by %s", p, ch.ref(j, i))
	} else {
		ch.seen[p] = i
	}
	if sd := filepath.Clean(c.Stats.Dir); sd == p || strings.HasPrefix(sd, p+"/") || p == "/" {
		ch.statsInside(pkey, "%q is inside the watched tree %q: its own stats files would keep it busy", c.Stats.Dir, p)
	}
	if ch.stat {
		ch.treeOnDisk(i, pkey, p, dupName)
	}
}

// treeOnDisk checks what is at path p of watch entry i (key pkey): a
// directory, not on overlayfs, not holding the stats directory through a
// symlink, and not a tree watched already under another name (dupName:
// one under this name was reported).
func (ch *checker) treeOnDisk(i int, pkey, p string, dupName bool) {
	fi, err := os.Stat(p)
	switch {
	case err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, unix.ENOTDIR) &&
		!errors.Is(err, unix.ELOOP) && !errors.Is(err, unix.ENAMETOOLONG) &&
		ch.c.keep != nil && ch.c.keep(p, err):
		// Served already, its filesystem dead (LoadKeeping).
	case errors.Is(err, fs.ErrNotExist):
		e := ch.s.errorf(pkey, "%q does not exist", p)
		e.err = err
		ch.errs = append(ch.errs, e)
	case err != nil:
		// The path quoted, as elsewhere (it may hold a NUL or a
		// newline), then stat's reason.
		msg := err.Error()
		if pe, ok := errors.AsType[*fs.PathError](err); ok {
			msg = pe.Err.Error()
		}
		e := ch.s.errorf(pkey, "%q: %s", p, msg)
		e.err = err
		ch.errs = append(ch.errs, e)
	case !fi.IsDir():
		ch.add(pkey, "%q is not a directory", p)
	case onOverlay(p):
		// Refused, not silently unserved: an overlay file's page
		// cache is its upper layer's, which cachestat(2) and
		// sync_file_range(2) on the overlay's descriptor do not see.
		ch.add(pkey, "%q is on overlayfs: cachestat and sync_file_range on its files see the overlay's own (empty) page cache, not the upper layer's, so its dirty data could not be found or written; watch the upper layer's directory (upperdir= in the overlay's mount options) instead", p)
	default:
		ch.statsInsideResolved(pkey, p)
		ch.sameTree(i, pkey, p, dupName, fi)
	}
}

// statsInsideResolved reports the stats directory inside the tree at p
// through a symlink (of either path): its own writes would keep the
// daemon busy.
func (ch *checker) statsInsideResolved(pkey, p string) {
	dir := ch.c.Stats.Dir
	if r, err := filepath.EvalSymlinks(p); err == nil {
		if sd, err := evalExisting(dir); err == nil && (sd == r || strings.HasPrefix(sd, r+"/") || r == "/") &&
			!(dir == p || strings.HasPrefix(filepath.Clean(dir), p+"/") || p == "/") {
			// Each path with what it resolves to, where that
			// differs.
			name := func(a, b string) string {
				if a == b {
					return strconv.Quote(a)
				}
				return fmt.Sprintf("%q (%q)", a, b)
			}
			ch.statsInside(pkey, "%s is inside the watched tree %s: its own stats files would keep it busy", name(dir, sd), name(p, r))
		}
	}
}

// sameTree reports the directory at p (watch entry i, key pkey, fi its
// stat) when an earlier entry watches it under another name: through a
// symlink, or through a bind mount (one inode under two names, whose
// files' events would be reported under one of them, with that tree's
// settings). dupName: an entry of the same name was reported already.
func (ch *checker) sameTree(i int, pkey, p string, dupName bool, fi fs.FileInfo) {
	before := len(ch.errs)
	if dupName {
		// Said already, by name.
	} else if r, err := filepath.EvalSymlinks(p); err == nil && r != p {
		if j, dup := ch.resolved[r]; dup {
			ch.add(pkey, "%q is %q, already watched by %s", p, r, ch.ref(j, i))
		} else if j, dup := ch.seen[r]; dup && j != i {
			ch.add(pkey, "%q is %q, already watched by %s", p, r, ch.ref(j, i))
		}
		ch.resolved[r] = i
	} else if j, dup := ch.resolved[p]; dup {
		ch.add(pkey, "%q is already watched by %s, through a symlink", p, ch.ref(j, i))
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		id := [2]uint64{uint64(st.Dev), uint64(st.Ino)}
		if j, dup := ch.sameDir[id]; !dup {
			ch.sameDir[id] = i
		} else if !dupName && len(ch.errs) == before {
			ch.add(pkey, "%q is the directory %s watches, under another name (a bind mount): it would be watched twice, its files reported under one name and with that tree's settings", p, ch.ref(j, i))
		}
	}
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
