package bdi

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/google/renameio/v2"
	"go.uber.org/zap"

	"flusherd/internal/logpath"
	"flusherd/policy"
)

// Stats is a device's statistics, the fields of the kernel's
// /sys/kernel/debug/bdi/<dev>/stats (mm/backing-dev.c bdi_debug_stats_show)
// followed by flusherd's own. Page counts are in pages; Format prints kB.
type Stats struct {
	BdiWriteback      uint64 // pages under writeback in tracked inodes, as last seen by cachestat (at attempts and background checks)
	BdiReclaimable    uint64 // dirty pages in tracked inodes, as last seen by cachestat (at attempts and background checks)
	BdiDirtyThresh    uint64 // pages; no per-bdi share in user space: DirtyThresh
	DirtyThresh       uint64 // pages, /proc/vmstat nr_dirty_threshold
	BackgroundThresh  uint64 // pages, /proc/vmstat nr_dirty_background_threshold
	BdiDirtied        uint64 // pages seen newly dirty in tracked inodes since the start (the growth of each inode's count between looks)
	BdiWritten        uint64 // pages written back by flusherd (attempts and range writebacks)
	BdiWriteBandwidth uint64 // kB/s, the device's completed writes, smoothed as wb_update_write_bandwidth does
	BDirty            int
	BIO               int // includes inodes under an attempt
	BMoreIO           int
	BMoreIOWait       int
	BDirtyTime        int // always 0: lazytime timestamps are not tracked
	BdiList           int // 1 while the writeback goroutine runs
	State             uint64
	BackgroundWorks   uint64 // background writeback works run (the threshold was passed)
	RangeWritebacks   uint64 // range writebacks behind streaming writers
	InflightBytes     uint64 // bytes under writeback in tracked inodes (BdiWriteback, in bytes)
	// InflightWindowBytes is what may be under writeback before big
	// files, ranges and background work wait (inflightWindow); 0: no bound.
	InflightWindowBytes uint64
	// PaceKBps is the pace flusherd starts writeback at (pacer), kB/s;
	// 0: none.
	PaceKBps uint64
	Probing  int // 1 while the device is probed with one file per pause (every retry failed with one device-level error)

	PlugRequests, PlugMerges, PlugBatches uint64
	RetryPauseMs                          int64
	WritebackErrors                       uint64
	InodesGone                            uint64 // dropped: the file was deleted or replaced
	Rescans                               uint64 // cachestat rescans of trees on this device (overflows, unwatched directories)
	StuckCalls                            int    // writeback calls past attempt_timeout that have not returned (a frozen filesystem)
	FailedFiles                           int    // files whose data was lost after a failed writeback, until written again
	Throttled                             uint64 // attempts of big files deferred while max_inflight was under writeback
	ListLockMaxUs                         int64  // the longest time the device's list lock was held, in microseconds
	DetachedCalls                         uint64 // writeback calls of big files' chunks left to finish on their worker (a slow device)
	LoopStallMaxUs                        int64  // the longest time the device's goroutine, awake, went without a sign of life (a wait on one call), in microseconds
	SweepCandidates                       int    // files open or mapped in the trees, looked at by the sweep (watcher.sweep_interval)
	SweepFound                            uint64 // files the sweep found dirty and not tracked: dirtied without an event
	OverBudget                            int    // 1 while new files are not tracked for the tracked-inode budget (overBudget)
	UntrackedReports                      uint64 // reports of new files not tracked for the budget; whole-filesystem passes write them
	SyncfsPasses                          uint64 // whole-filesystem passes (syncfs) completed over the budget
	SyncfsErrors                          uint64 // of those and of passes that could not be made, the ones that failed

	// Outcomes counts attempts by policy.Outcome (not in the file).
	Outcomes [policy.NumOutcomes]uint64
}

// The bits of State, as enum wb_state (include/linux/backing-dev-defs.h).
const (
	WBRegistered       = 1 << 0
	WBWritebackRunning = 1 << 1
	WBHasDirtyIO       = 1 << 2
)

// Format writes s in the kernel's layout: the same names, order, padding
// ("%-20s%10d") and kB units, with b_more_io_wait after b_more_io and
// flusherd's fields after state. pageSize is in bytes.
func (s *Stats) Format(w io.Writer, pageSize int) error {
	var b strings.Builder
	for _, f := range s.statsFields() {
		var v int64
		switch {
		case f.kB:
			v = int64(*f.u * uint64(pageSize) / 1024)
		case f.u != nil:
			v = int64(*f.u)
		case f.i != nil:
			v = *f.i
		default:
			v = int64(*f.n)
		}
		verb, unit := "%-20s%10d", ""
		switch {
		case f.key == "state":
			verb = "%-20s%10x"
		case f.kB:
			unit = " kB"
		case f.key == "BdiWriteBandwidth":
			unit = " kBps"
		}
		fmt.Fprintf(&b, verb+unit+"\n", f.key+":", v)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// statsFields maps each line of the stats file to its field, in file
// order, for Format and ParseStats; kB marks the fields kept in pages and
// written in kB.
func (s *Stats) statsFields() []struct {
	key string
	kB  bool
	u   *uint64
	i   *int64
	n   *int
} {
	type f = struct {
		key string
		kB  bool
		u   *uint64
		i   *int64
		n   *int
	}
	return []f{
		{"BdiWriteback", true, &s.BdiWriteback, nil, nil},
		{"BdiReclaimable", true, &s.BdiReclaimable, nil, nil},
		{"BdiDirtyThresh", true, &s.BdiDirtyThresh, nil, nil},
		{"DirtyThresh", true, &s.DirtyThresh, nil, nil},
		{"BackgroundThresh", true, &s.BackgroundThresh, nil, nil},
		{"BdiDirtied", true, &s.BdiDirtied, nil, nil},
		{"BdiWritten", true, &s.BdiWritten, nil, nil},
		{"BdiWriteBandwidth", false, &s.BdiWriteBandwidth, nil, nil},
		{"b_dirty", false, nil, nil, &s.BDirty},
		{"b_io", false, nil, nil, &s.BIO},
		{"b_more_io", false, nil, nil, &s.BMoreIO},
		{"b_more_io_wait", false, nil, nil, &s.BMoreIOWait},
		{"b_dirty_time", false, nil, nil, &s.BDirtyTime},
		{"bdi_list", false, nil, nil, &s.BdiList},
		{"state", false, &s.State, nil, nil},
		{"background_works", false, &s.BackgroundWorks, nil, nil},
		{"range_writebacks", false, &s.RangeWritebacks, nil, nil},
		{"inflight_bytes", false, &s.InflightBytes, nil, nil},
		{"window_bytes", false, &s.InflightWindowBytes, nil, nil},
		{"pace_kBps", false, &s.PaceKBps, nil, nil},
		{"probing", false, nil, nil, &s.Probing},
		{"plug_requests", false, &s.PlugRequests, nil, nil},
		{"plug_merges", false, &s.PlugMerges, nil, nil},
		{"plug_batches", false, &s.PlugBatches, nil, nil},
		{"retry_pause_ms", false, nil, &s.RetryPauseMs, nil},
		{"writeback_errors", false, &s.WritebackErrors, nil, nil},
		{"inodes_gone", false, &s.InodesGone, nil, nil},
		{"rescans", false, &s.Rescans, nil, nil},
		{"stuck_calls", false, nil, nil, &s.StuckCalls},
		{"failed_files", false, nil, nil, &s.FailedFiles},
		{"throttled", false, &s.Throttled, nil, nil},
		{"detached_calls", false, &s.DetachedCalls, nil, nil},
		{"list_lock_max_us", false, nil, &s.ListLockMaxUs, nil},
		{"loop_stall_max_us", false, nil, &s.LoopStallMaxUs, nil},
		{"sweep_candidates", false, nil, nil, &s.SweepCandidates},
		{"sweep_found", false, &s.SweepFound, nil, nil},
		{"over_budget", false, nil, nil, &s.OverBudget},
		{"untracked_reports", false, &s.UntrackedReports, nil, nil},
		{"syncfs_passes", false, &s.SyncfsPasses, nil, nil},
		{"syncfs_errors", false, &s.SyncfsErrors, nil, nil},
	}
}

// ErrStatsFormat is the error of ParseStats for a malformed stats file.
var ErrStatsFormat = errors.New("malformed stats file")

// ParseStats reads a stats file written by Format (pageSize in bytes, as
// given to Format; kB values become pages): "key: value[ unit]" lines,
// state in hex. Lines it does not know (a newer daemon's) are skipped. A
// malformed line, or a file without the four lists of tracked files
// (b_dirty, b_io, b_more_io, b_more_io_wait), is an error wrapping
// ErrStatsFormat. Outcomes are not in the file and stay zero.
func ParseStats(data []byte, pageSize int) (Stats, error) {
	var s Stats
	byKey := map[string]int{}
	fields := s.statsFields()
	for i, f := range fields {
		byKey[f.key] = i
	}
	lists := 0
	for n, line := range strings.Split(strings.TrimRight(string(data), "\n"), "\n") {
		key, rest, ok := strings.Cut(line, ":")
		v := strings.Fields(rest)
		if !ok || len(v) < 1 || len(v) > 2 {
			return Stats{}, fmt.Errorf("line %d: %q: %w", n+1, line, ErrStatsFormat)
		}
		i, known := byKey[strings.TrimSpace(key)]
		if !known {
			continue
		}
		f := fields[i]
		base := 10
		if f.key == "state" {
			base = 16
		}
		x, err := strconv.ParseInt(v[0], base, 64)
		if err != nil {
			return Stats{}, fmt.Errorf("line %d: %q: %w: %w", n+1, line, ErrStatsFormat, err)
		}
		switch {
		case f.kB:
			*f.u = uint64(x) * 1024 / uint64(pageSize)
		case f.u != nil:
			*f.u = uint64(x)
		case f.i != nil:
			*f.i = x
		default:
			*f.n = int(x)
		}
		switch f.key {
		case "b_dirty", "b_io", "b_more_io", "b_more_io_wait":
			lists++
		}
	}
	if lists != 4 {
		return Stats{}, fmt.Errorf("b_dirty, b_io, b_more_io and b_more_io_wait not all there: %w", ErrStatsFormat)
	}
	return s, nil
}

// Tracked is the number of tracked files the stats count: b_dirty, b_io,
// b_more_io and b_more_io_wait.
func (s *Stats) Tracked() int { return s.BDirty + s.BIO + s.BMoreIO + s.BMoreIOWait }

// Snapshot returns the device's statistics now. It walks the lists and the
// lists under the list lock (as bdi_debug_stats_show does) and makes no
// system calls; thresholds are left zero.
func (wb *Writeback) Snapshot() Stats {
	wb.mu.Lock()
	defer wb.mu.Unlock()
	var s Stats
	s.BdiReclaimable, s.BdiWriteback = wb.acct.dirtySum, wb.acct.wbSum
	s.InflightBytes = wb.acct.wbSum * uint64(os.Getpagesize())
	s.InflightWindowBytes = uint64(max(wb.window.size(), 0))
	s.PaceKBps = uint64(wb.pace.Rate() / 1024)
	s.BackgroundWorks, s.RangeWritebacks = wb.acct.backgroundWorks, wb.acct.rangeWritebacks
	if wb.probe.on {
		s.Probing = 1
	}
	s.BdiWritten = wb.acct.written
	s.BdiDirtied = max(wb.acct.dirtied, wb.acct.written)
	s.BdiWriteBandwidth = wb.bw.kBps.Load()
	s.BDirty = wb.bDirty.len()
	s.BIO = wb.BIO.Len() + wb.inflight.Len()
	s.BMoreIO = wb.BMoreIO.Len()
	s.BMoreIOWait = wb.BMoreIOWait.Len()
	if wb.running {
		s.BdiList = 1
		s.State |= WBRegistered
	}
	if !wb.inflight.Empty() {
		s.State |= WBWritebackRunning
	}
	if wb.hasDirtyIOLocked() {
		s.State |= WBHasDirtyIO
	}
	s.RetryPauseMs = wb.pause.Milliseconds()
	s.PlugRequests, s.PlugMerges, s.PlugBatches = wb.acct.plug[0], wb.acct.plug[1], wb.acct.plug[2]
	s.WritebackErrors = wb.acct.errors
	s.InodesGone = wb.acct.gone
	s.Rescans = wb.acct.rescans
	s.StuckCalls = wb.acct.stuck + wb.calls.stuck(wb.cfg.AttemptTimeout)
	s.FailedFiles = wb.acct.failed
	s.Throttled = wb.acct.throttled
	s.DetachedCalls = wb.acct.detached
	s.ListLockMaxUs = wb.mu.MaxHold().Microseconds()
	s.LoopStallMaxUs = time.Duration(wb.live.stallMax.Load()).Microseconds()
	s.SweepCandidates, s.SweepFound = len(wb.sweep.cands), wb.sweep.found
	if wb.over.on {
		s.OverBudget = 1
	}
	s.UntrackedReports, s.SyncfsPasses, s.SyncfsErrors = wb.over.untracked, wb.over.passes, wb.over.errs
	s.Outcomes = wb.acct.outcomes
	return s
}

// The backoff of stats writes after a failure.
const (
	statsRetryMin = time.Second
	statsRetryMax = time.Minute
)

// NewStatsWriter returns a writer for <dir>/bdi/<name>/stats; thresholds
// supplies DirtyThresh and BackgroundThresh in pages (sysfs
// DirtyThresholds). The file is rewritten at most every `every` while
// something changes.
func NewStatsWriter(dir, name string, every time.Duration, thresholds func() (uint64, uint64, error), log *zap.Logger) *statsWriter {
	return &statsWriter{path: filepath.Join(dir, "bdi", name, "stats"), thresholds: thresholds, every: every, log: log}
}

// writeStats rewrites the stats file if something changed since the last
// write and the last write is at least `every` old, or force is set, or
// nothing is dirty any more (so the drained state is always visible).
func (wb *Writeback) writeStats(force bool) {
	sw := wb.stats
	if sw == nil {
		return
	}
	now := wb.now()
	wb.mu.Lock()
	gen, idle := wb.gen, !wb.hasDirtyIOLocked()
	wb.mu.Unlock()
	if sw.written && !force && (gen == sw.lastGen || (!idle && now-sw.last < sw.every)) {
		return
	}
	if sw.retry > 0 && now < sw.nextTry && !force {
		return // backing off after a failed write
	}
	s := wb.Snapshot()
	if sw.thresholds != nil {
		if d, b, err := sw.thresholds(); err == nil {
			s.DirtyThresh, s.BackgroundThresh, s.BdiDirtyThresh = d, b, d
		}
	}
	if err := WriteFileAtomic(sw.path, func(w io.Writer) error { return s.Format(w, os.Getpagesize()) }); err != nil {
		sw.retry = min(max(2*sw.retry, statsRetryMin), statsRetryMax)
		sw.nextTry = now + sw.retry
		if msg := err.Error(); msg != sw.lastErr {
			sw.lastErr = msg
			sw.log.Warn("cannot write stats file; retrying with backoff (logged once per error)",
				zap.Error(err), zap.Stringer("next_try", sw.retry))
		}
		return
	}
	if sw.lastErr != "" {
		sw.log.Info("stats file written again", logpath.String("path", sw.path))
	}
	sw.lastErr, sw.retry = "", 0
	sw.lastGen, sw.last, sw.written = gen, now, true
}

// due returns when the stats file is next due to be rewritten
// (daemon clock), and whether it is due at all: a change not yet written
// waits for the rate limit, or for the backoff after a failed write.
func (sw *statsWriter) due(gen uint64) (time.Duration, bool) {
	switch {
	case sw == nil || gen == sw.lastGen && sw.written:
		return 0, false
	case sw.retry > 0:
		return sw.nextTry, true
	case sw.written:
		return sw.last + sw.every, true
	}
	return 0, false
}

// WriteFileAtomic replaces path with what write produces, with
// github.com/google/renameio/v2: it writes a temporary file in the same
// directory (".stats<digits>" for a file named stats; RemoveStaleTemps
// removes those a killed process left), fsyncs it (renameio always does:
// free on the tmpfs of /run, the default stats.dir) and renames it over
// path, so that a reader sees either the old or the new file, never a
// part. The file's mode is 0644 whatever the umask. Missing directories are created
// with mode 0755. Errors are *os.PathError naming path (not the temporary
// file, whose random name would make every failure look new), with the
// step ("mkdir", "create", "write", "rename") as Op.
func WriteFileAtomic(path string, write func(io.Writer) error) (err error) {
	op := "mkdir"
	defer func() {
		if err != nil {
			var pe *os.PathError
			if errors.As(err, &pe) {
				err = pe.Err
			}
			err = &os.PathError{Op: op, Path: path, Err: err}
		}
	}()
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	op = "create"
	t, err := renameio.NewPendingFile(path, renameio.WithTempDir(dir), renameio.WithStaticPermissions(0o644))
	if err != nil {
		return err
	}
	defer t.Cleanup()
	op = "write"
	if err := write(t); err != nil {
		return err
	}
	op = "rename"
	return t.CloseAtomicallyReplace()
}

// staleTemp matches the temporary files of WriteFileAtomic for a file
// named stats: renameio's ".stats<digits>", and ".stats-<digits>" from
// os.CreateTemp in earlier versions.
var staleTemp = regexp.MustCompile(`^\.stats-?[0-9]+$`)

// RemoveStaleTemps removes the temporary files that WriteFileAtomic
// leaves when the process is killed between their creation and their
// rename, and returns how many it removed. It looks only where the daemon
// writes stats files: dir/watch and each directory dir/bdi/<dev>, not
// below them (a watched tree may lie under stats.dir, and a user's file
// of the same name there is not the daemon's). Call it only while no other
// process writes there (the daemon holds stats.dir's lock). Symlinks are
// neither followed nor removed. A directory that does not exist is not an
// error.
func RemoveStaleTemps(dir string) (removed int, err error) {
	dirs := []string{filepath.Join(dir, "watch")}
	ents, err := os.ReadDir(filepath.Join(dir, "bdi"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return 0, err
	}
	for _, e := range ents {
		if e.IsDir() { // (a symlink is not: DirEntry's type is lstat's)
			dirs = append(dirs, filepath.Join(dir, "bdi", e.Name()))
		}
	}
	for _, d := range dirs {
		ents, err := os.ReadDir(d)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return removed, err
		}
		for _, e := range ents {
			if e.Type().IsRegular() && staleTemp.MatchString(e.Name()) {
				if err := os.Remove(filepath.Join(d, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
					return removed, err
				}
				removed++
			}
		}
	}
	return removed, nil
}
