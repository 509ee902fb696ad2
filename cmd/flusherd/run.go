package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sys/unix"

	"flusherd/bdi"
	"flusherd/config"
	"flusherd/control"
	"flusherd/inode"
	"flusherd/internal/earlysig"
	"flusherd/policy"
	"flusherd/service"
	"flusherd/sysfs"
	"flusherd/watch"
)

func cmdRun(args []string, stdout, stderr io.Writer) int {
	// From here on (from the package initialisation on, earlysig, when
	// the process was started as "flusherd run") a signal the unit or an
	// operator sends (TERM, INT, HUP) is never taken with its default
	// action (exit, for SIGHUP too): before run() is ready for them,
	// they wait in the channel.
	sigs := earlysig.Take()
	if sigs == nil {
		sigs = make(chan os.Signal, 4)
	}
	signal.Notify(sigs, earlysig.Signals...)
	defer signal.Stop(sigs)
	fset := newFlagSet("run", "run [--config FILE] [--watch DIR]... [--stats-dir DIR]\n\n"+
		"Watch the trees and write their dirty data back, in the foreground, logging to\n"+
		"stderr. SIGHUP reloads the configuration (an invalid one is logged and the running\n"+
		"one kept; stats.dir, watcher.* and metrics.listen wait for a restart). SIGTERM or\n"+
		"SIGINT writes every tracked file back, within writeback.shutdown_timeout, and exits\n"+
		"0; a second one ends that wait at once. Under systemd: systemctl reload|stop flusherd.",
		"flusherd run --watch ./demo-data --stats-dir ./demo-run", stdout, stderr)
	var c commonFlags
	c.register(fset)
	var watches multiFlag
	fset.Var(&watches, "watch", "`directory` tree to watch, recursively, in writeback mode (repeatable; added to the config's [[watch]] entries)")
	if code, stop := parseFlags(fset, args); stop {
		return code
	}
	cfg, err := loadConfig(c, watches)
	if err == nil {
		err = cfg.Validate()
	}
	if err == nil && len(cfg.Watch) == 0 && !c.readsFile() {
		// Without a configuration file, nothing to watch is a mistake;
		// a file that names no tree (as packaged) starts the daemon idle.
		err = errors.New("nothing to watch: give --watch DIR, or --config FILE with [[watch]] entries")
	}
	if err != nil {
		printErr(stderr, "flusherd run", err)
		return exitUsage
	}
	if os.Getenv("GOGC") == "" {
		// Most of the heap is the tracked inodes, which live long: a
		// smaller collection headroom than Go's default 100% keeps the
		// RSS per tracked file down, for a little more GC work while
		// files are added. GOGC in the environment overrides it.
		debug.SetGCPercent(gcPercent)
	}
	level, err := zap.ParseAtomicLevel(cfg.Log.Level)
	if err != nil {
		fmt.Fprintf(stderr, "flusherd run: log.level: %v\n", err)
		return exitUsage
	}
	log := newLogger(level, stderr)
	defer log.Sync()
	for _, n := range cfg.Notes() {
		log.Warn("configuration: " + n)
	}
	reload := func() (*config.Config, error) {
		cfg, err := loadConfig(c, watches)
		if err == nil {
			err = cfg.Validate()
		}
		return cfg, err
	}
	if err := run(cfg, log, level, reload, sigs); err != nil {
		log.Error("flusherd failed", zap.Error(err))
		if errors.Is(err, watch.ErrBackendRefused) {
			return exitUsage // the configuration asks for what cannot be
		}
		return exitFailed
	}
	return exitOK
}

// gcPercent is the daemon's GOGC unless the environment sets one.
const gcPercent = 50

// newLogger logs to w at level. Under systemd (JOURNAL_STREAM set) it
// writes no timestamp, since the journal adds its own, and starts each line
// with the sd-daemon(3) priority prefix ("<3>" error, "<4>" warning, "<6>"
// info, "<7>" debug), which the journal maps to the entry's priority.
func newLogger(lvl zapcore.LevelEnabler, w io.Writer) *zap.Logger {
	ec := zap.NewProductionEncoderConfig()
	ec.EncodeTime = zapcore.ISO8601TimeEncoder
	ec.EncodeLevel = zapcore.CapitalLevelEncoder
	if os.Getenv("JOURNAL_STREAM") != "" {
		ec.TimeKey = ""
		ec.EncodeLevel = journalLevel
	}
	core := zapcore.NewCore(zapcore.NewConsoleEncoder(ec), zapcore.Lock(zapcore.AddSync(w)), lvl)
	return zap.New(core)
}

// journalLevel writes the level with its sd-daemon(3) prefix.
func journalLevel(l zapcore.Level, enc zapcore.PrimitiveArrayEncoder) {
	prio := 6 // SD_INFO
	switch {
	case l >= zapcore.ErrorLevel:
		prio = 3 // SD_ERR
	case l == zapcore.WarnLevel:
		prio = 4 // SD_WARNING
	case l <= zapcore.DebugLevel:
		prio = 7 // SD_DEBUG
	}
	enc.AppendString(fmt.Sprintf("<%d>%s", prio, l.CapitalString()))
}

// bdiConfig maps the [writeback] and [plug] tables to a device's tunables.
func bdiConfig(cfg *config.Config) bdi.Config {
	req := policy.IOWait
	if cfg.Writeback.RequeueBlocked == config.RequeueRedirtyTail {
		req = policy.LegacyRedirtyTail
	}
	return bdi.Config{
		DirtyWritebackInterval: cfg.Writeback.DirtyWritebackInterval,
		MinPause:               cfg.Writeback.MinPause,
		MaxPause:               cfg.Writeback.MaxPause,
		WriteChunk:             cfg.Writeback.WriteChunk,
		WriteChunkAuto:         cfg.Writeback.WriteChunkAuto,
		MaxInflight:            cfg.Plug.MaxInflightBytes,
		DirtyBackgroundBytes:   cfg.Writeback.DirtyBackgroundBytes,
		DirtyBackgroundRatio:   cfg.Writeback.DirtyBackgroundRatio,
		RangeBytes:             cfg.Writeback.RangeBytes,
		Requeue:                req,
		PlugEnabled:            cfg.Plug.Enabled,
		MaxPending:             cfg.Plug.MaxPending,
		QueueDepth:             cfg.Plug.QueueDepth,
		IntegritySyncfs:        cfg.Plug.IntegritySyncfs,
		AttemptTimeout:         cfg.Writeback.AttemptTimeout,
	}
}

// resolveBdi names the bdi of st_dev dev, opening path O_PATH (no symlink
// followed, inode.OpenPath) for the filesystems (btrfs) whose name needs a
// descriptor.
func resolveBdi(sys sysfs.FS) func(dev uint64, path string) (string, error) {
	return func(dev uint64, path string) (string, error) {
		fd, err := inode.OpenPath(path)
		if err != nil {
			return sys.BdiName(dev, -1)
		}
		defer unix.Close(fd)
		return sys.BdiName(dev, fd)
	}
}

// claimStatsDir makes the stats directory if needed, checks that no one
// else can write in it (owned by this user, not group- or
// world-writable, not a symlink: another user could otherwise plant
// symlinks that the daemon would write through, or a socket of their own),
// and locks it (flock on <dir>/flusherd.lock) so that a second daemon with
// the same stats directory fails at once instead of taking over the
// control socket. unlock releases the lock.
func claimStatsDir(dir string) (unlock func(), err error) {
	// elsewhere is what every refusal below suggests.
	const elsewhere = "choose another directory with --stats-dir or stats.dir"
	if err := os.MkdirAll(dir, 0o755); err != nil {
		if errors.Is(err, unix.EROFS) && (os.Geteuid() == 0 || underSystemd()) {
			// As root, a read-only directory is the sandbox's doing
			// (ProtectSystem=strict), or a read-only filesystem.
			return nil, fmt.Errorf("stats.dir: %w (the shipped flusherd.service lets flusherd write only in /run/flusherd: "+
				"keep the default, or add ReadWritePaths=%s in a drop-in, /etc/systemd/system/flusherd.service.d/*.conf; "+
				"outside systemd, %s on a writable filesystem)", err, dir, elsewhere)
		}
		if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) || errors.Is(err, unix.EROFS) {
			return nil, fmt.Errorf("stats.dir: %w (run as root, or %s, one this user may write)", err, elsewhere)
		}
		return nil, fmt.Errorf("stats.dir: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return nil, fmt.Errorf("stats.dir: %w", &os.PathError{Op: "lstat", Path: dir, Err: err})
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return nil, fmt.Errorf("stats.dir %s is not a directory (a symlink is not accepted): %s", strconv.Quote(dir), elsewhere)
	case int(st.Uid) != os.Geteuid():
		return nil, fmt.Errorf("stats.dir %s belongs to uid %d, not to this user (uid %d): refusing to write there; chown it, or %s",
			strconv.Quote(dir), st.Uid, os.Geteuid(), elsewhere)
	case st.Mode&0o022 != 0:
		return nil, fmt.Errorf("stats.dir %s is writable by group or others (mode %#o): refusing to write there; chmod go-w it, or %s",
			strconv.Quote(dir), st.Mode&0o7777, elsewhere)
	}
	lock := filepath.Join(dir, "flusherd.lock")
	fd, err := unix.Open(lock, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("stats.dir: %w", &os.PathError{Op: "open", Path: lock, Err: err})
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("another flusherd runs with stats.dir %s (it holds %s)", strconv.Quote(dir), lock)
		}
		return nil, fmt.Errorf("stats.dir: flock %s: %w", lock, err)
	}
	return func() { unix.Close(fd) }, nil
}

// writeWatchStats writes <dir>/watch/stats now (watch.WriteStats); a
// failure is logged.
func writeWatchStats(dir string, wat watch.Backend, log *zap.Logger) {
	if err := watch.WriteStats(dir, wat.Name(), wat.Counters(), wat.Trees()); err != nil {
		log.Warn("cannot write the watch stats file", zap.Error(err))
	}
}

// plural is "n one" for n = 1, "n many" otherwise (STATUS= lines).
func plural[N int | uint64](n N, one, many string) string {
	if n == 1 {
		return fmt.Sprintf("1 %s", one)
	}
	return fmt.Sprintf("%d %s", n, many)
}

// treesOf resolves the configuration's watch roots (symlinks in them are
// resolved once, here).
func treesOf(cfg *config.Config) ([]watch.Tree, error) {
	trees := make([]watch.Tree, 0, len(cfg.Watch))
	for _, w := range cfg.Watch {
		root, err := filepath.EvalSymlinks(w.Path)
		if err != nil {
			return nil, fmt.Errorf("watch %s: %w", strconv.Quote(w.Path), err)
		}
		trees = append(trees, watch.Tree{Root: root, Recursive: w.Recursive,
			Tree: bdi.Tree{Expire: w.Expire, Integrity: w.Mode == config.ModeIntegrity}})
	}
	return trees, nil
}

// run is the daemon: it starts watching, tells systemd it is ready once
// every root is watched (the initial cachestat scan goes on after that),
// serves the control socket and the metrics, pings the watchdog while the
// writeback goroutines are healthy, reloads the configuration on SIGHUP
// (reload returns the new one, validated), and on SIGTERM or SIGINT writes
// everything back within shutdown_timeout.
func run(cfg *config.Config, log *zap.Logger, level zap.AtomicLevel, reload func() (*config.Config, error), sigs <-chan os.Signal) error {
	n := &notifier{log: log}
	unlock, err := claimStatsDir(cfg.Stats.Dir)
	if err != nil {
		return err
	}
	defer unlock()
	if n, err := bdi.RemoveStaleTemps(cfg.Stats.Dir); err != nil {
		log.Warn("cannot remove the temporary files a killed flusherd left in stats.dir", zap.String("dir", cfg.Stats.Dir), zap.Error(err))
	} else if n > 0 {
		log.Info("removed temporary stats files that a killed flusherd left", zap.String("dir", cfg.Stats.Dir), zap.Int("files", n))
	}

	// Until READY=1, systemd's TimeoutStartSec runs: while start-up makes
	// progress, extend it.
	// Progress is counted in steps that can each take long on a slow
	// filesystem: each tree set up (its root opened to register it for
	// opens by handle and for error checks), each tree offered to the
	// watcher (its root opened again for the fanotify mark).
	var setUp, offered atomic.Int64
	stopExtend := n.extendWhile(2*time.Second, 6*time.Second, func() string {
		s := fmt.Sprintf("starting: %d of %s set up", setUp.Load(), plural(len(cfg.Watch), "tree", "trees"))
		if o := offered.Load(); o > 0 {
			s += fmt.Sprintf(", %d of %d offered to the watcher", o, len(cfg.Watch))
		}
		return s
	}, func() int64 { return setUp.Load() + offered.Load() })
	defer stopExtend()

	sys := sysfs.Default()
	handles := inode.NewHandles()
	defer handles.Close()
	errs := bdi.NewErrWatch()
	defer errs.Close()
	reg := bdi.NewRegistry(bdi.Options{
		Config:      bdiConfig(cfg),
		StatsDir:    cfg.Stats.Dir,
		StatsEvery:  min(time.Second, cfg.Writeback.DirtyWritebackInterval),
		Resolve:     resolveBdi(sys),
		Thresholds:  sys.DirtyThresholds,
		NrDirty:     sys.NrDirty,
		DiskWritten: sys.DiskWritten,
		Opener:      handles,
		Handles:     handles,
		Log:         log,
		Errs:        errs,
	})
	trees, err := treesOf(cfg)
	if err != nil {
		return err
	}
	if err := inode.ProbeOpenat2(); err != nil {
		log.Info("openat2(2) is refused (under systemd, RestrictSUIDSGID=yes does this): paths in the trees are resolved one component at a time with openat(2) and O_NOFOLLOW instead",
			zap.Error(err))
	}
	if len(trees) == 0 {
		log.Warn("no [[watch]] entries in the configuration: idle until a tree is added and the configuration reloaded (SIGHUP; systemctl reload flusherd)")
	}
	for _, t := range trees {
		log.Info("watching", zap.String("root", strconv.Quote(t.Root)), zap.Bool("recursive", t.Recursive),
			zap.Bool("integrity", t.Integrity), zap.Stringer("expire", t.Expire))
		if kind, ok := watch.NoWriteback(t.Root); ok {
			log.Warn("this tree is on a filesystem without writeback: its files have no backing store and there is never anything to write back",
				zap.String("root", strconv.Quote(t.Root)), zap.String("fstype", kind))
		}
		if _, err := handles.AddMount(t.Root); err != nil {
			log.Info("files of this tree are opened by path, not by file handle", zap.String("root", strconv.Quote(t.Root)), zap.Error(err))
		}
		watchErrors(errs, t, log)
		setUp.Add(1)
	}
	wat, err := watch.New(trees, reg, watch.Options{Backend: cfg.Watcher.Backend, Opener: handles, Handles: handles,
		RescanInterval: cfg.Watcher.RescanInterval, RetryMin: cfg.Writeback.MinPause, RetryMax: cfg.Writeback.MaxPause,
		StatsDir: cfg.Stats.Dir, Log: log, Progress: func() { offered.Add(1) }})
	if err != nil {
		return err
	}
	reg.Observe(wat.Observer())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	// Events are read while the initial scan runs, so the queue cannot
	// overflow during a long scan.
	go func() { defer close(done); wat.Run(ctx) }()
	if err := wat.WatchRoots(); err != nil {
		cancel()
		wat.Close()
		<-done
		reg.Stop()
		return err
	}
	stopExtend()

	writeWatchStats(cfg.Stats.Dir, wat, log)
	sock := socketPath(cfg.Stats.Dir)
	var ctl *control.Server
	if err := os.MkdirAll(cfg.Stats.Dir, 0o755); err != nil {
		log.Error("cannot create the stats directory; flusherd sync will not reach this daemon", zap.Error(err))
	} else if ctl, err = control.Listen(sock, service.ControlHandler(reg, wat), log); err != nil {
		log.Error("cannot create the control socket; flusherd sync will not reach this daemon", zap.Error(err))
	} else {
		go ctl.Serve(ctx)
		defer ctl.Close()
	}
	waitMetrics := startMetrics(ctx, cfg, reg, wat, log)
	defer waitMetrics()

	// The initial scan runs after READY=1; STATUS= shows its progress.
	// READY=1 goes first, so the scan's last STATUS= is never followed by
	// an older one.
	ready := "every root is watched (the initial scan goes on)"
	if os.Getenv("NOTIFY_SOCKET") != "" {
		ready = "every root is watched; READY=1 (the initial scan goes on)"
	}
	log.Info(ready, zap.String("backend", wat.Name()))
	n.send(fmt.Sprintf("READY=1\nSTATUS=watching %s (%s); initial scan running", plural(len(trees), "tree", "trees"), wat.Name()))
	scanCtx, stopScan := context.WithCancel(ctx)
	defer stopScan()
	scanned := make(chan struct{})
	// What the scan's goroutine needs of cfg and trees, taken now: a
	// reload replaces both on this goroutine meanwhile.
	statsDir, ntrees := cfg.Stats.Dir, len(trees)
	go func() {
		defer close(scanned)
		wat.Scan(scanCtx)
		writeWatchStats(statsDir, wat, log)
		if scanCtx.Err() == nil {
			log.Info("initial scan done; ready", zap.Uint64("directories", wat.ScannedDirs()),
				zap.Int("devices", len(reg.Devices())), zap.String("socket", sock))
			if ntrees == 0 {
				n.send("STATUS=idle: no [[watch]] entries configured")
			} else {
				n.send(fmt.Sprintf("STATUS=watching %s (%s); initial scan done: %s", plural(ntrees, "tree", "trees"), wat.Name(), plural(wat.ScannedDirs(), "directory", "directories")))
			}
		}
	}()
	go n.progress(scanned, 2*time.Second, func() string {
		return fmt.Sprintf("STATUS=watching %s (%s); initial scan: %s scanned", plural(ntrees, "tree", "trees"), wat.Name(), plural(wat.ScannedDirs(), "directory", "directories"))
	})
	if interval, err := daemon.SdWatchdogEnabled(false); err != nil {
		log.Warn("WATCHDOG_USEC is set but unusable; no watchdog pings", zap.Error(err))
	} else if interval > 0 {
		log.Info("systemd watchdog enabled; pinging while every device's writeback goroutine is healthy", zap.Stringer("interval", interval))
		if interval < 2*cfg.Writeback.AttemptTimeout {
			log.Warn("WatchdogSec is less than twice writeback.attempt_timeout: a device waiting out one hung call may look wedged and be restarted",
				zap.Stringer("watchdog", interval), zap.Stringer("attempt_timeout", cfg.Writeback.AttemptTimeout))
		}
		go watchdogLoop(ctx, interval, reg, n, log)
	}

	// A reload that could not be completed for want of resources (the
	// config file or a new tree's root could not be opened: EMFILE,
	// ENOMEM, ...) is retried with backoff, min_pause doubling to
	// max_pause, until one completes: an operator's SIGHUP is never lost
	// to a passing shortage.
	var stopSig os.Signal
	var retry <-chan time.Time
	var retryPause policy.Backoff // its Pause is 0 while no retry is due
loop:
	for {
		select {
		case sig, ok := <-sigs:
			if !ok {
				break loop
			}
			if sig != syscall.SIGHUP {
				stopSig = sig
				break loop
			}
		case <-retry:
			retry = nil
		}
		c, t, short := reloadConfig(cfg, trees, reload, reg, wat, handles, errs, level, n, log)
		if c != nil {
			cfg, trees = c, t
			// Its tree: lines name the trees served now (the watcher
			// writes the file again only on its next event).
			writeWatchStats(cfg.Stats.Dir, wat, log)
		}
		switch {
		case short:
			if retryPause.Pause == 0 {
				log.Warn("the reload could not be completed for want of resources; retrying with backoff until it completes",
					zap.Stringer("first_retry", cfg.Writeback.MinPause))
			}
			retryPause.Min, retryPause.Max = cfg.Writeback.MinPause, cfg.Writeback.MaxPause
			retry = time.After(retryPause.Next(false))
		case retryPause.Pause > 0:
			log.Info("the reload retried after the resource shortage completed")
			retryPause.Reset()
		}
	}
	if stopSig == nil {
		stopSig = syscall.SIGTERM
	}
	// scanCut: the initial scan was stopped before it had reached every
	// directory, so a dirty file there is not tracked, and the last line
	// must not say that all is clean.
	var scanCut error
	select {
	case <-scanned:
	default:
		log.Info("signal received during the initial scan; stopping it", zap.String("signal", stopSig.String()))
		scanCut = errors.New("the initial scan was stopped by the signal before it had finished: files it had not reached may be dirty and are not tracked")
	}
	stopScan()
	<-scanned
	log.Info("writing back every tracked file before exit",
		zap.String("signal", stopSig.String()), zap.Stringer("timeout", cfg.Writeback.ShutdownTimeout))
	// The stop may take the quiesce (2 s), then shutdown_timeout, and a
	// margin for the rest: systemd's TimeoutStopSec= is extended to
	// that, so that a shutdown_timeout above it is honoured.
	n.send(fmt.Sprintf("%s\nEXTEND_TIMEOUT_USEC=%d", daemon.SdNotifyStopping, stopBudget(cfg.Writeback.ShutdownTimeout).Microseconds()))
	// A second SIGINT or SIGTERM (an operator's second Ctrl-C) ends the
	// shutdown's writeback at once, as shutdown_timeout would.
	cutCtx, cut := context.WithCancel(context.Background())
	defer cut()
	var cutBySignal atomic.Bool
	go func() {
		for {
			select {
			case sig, ok := <-sigs:
				if !ok {
					return
				}
				if sig == syscall.SIGHUP {
					continue
				}
				log.Warn("second signal: ending the writeback before exit now; what is not written back is left to the kernel's flusher",
					zap.String("signal", sig.String()))
				cutBySignal.Store(true)
				cut()
				return
			case <-cutCtx.Done():
				return
			}
		}
	}()
	// Files written just before the signal have their events still
	// queued: handle them, so that they are written back too.
	qctx, qcancel := context.WithTimeout(cutCtx, 2*time.Second)
	wat.Quiesce(qctx)
	qcancel()
	sctx, scancel := context.WithTimeout(cutCtx, cfg.Writeback.ShutdownTimeout)
	defer scancel()
	// Events lost to a shortage: their files are found by the rescan
	// that makes up for them, now rather than after its delay.
	unsettled := errors.Join(scanCut, wat.Settle(sctx))
	cancel()
	wat.Close()
	<-done
	rep := reg.Shutdown(sctx)
	writeWatchStats(cfg.Stats.Dir, wat, log) // with the shutdown's rescans
	end := fmt.Sprintf("shutdown_timeout (%v) ended", cfg.Writeback.ShutdownTimeout)
	if cutBySignal.Load() {
		end = "a second signal ended the shutdown"
	}
	logShutdown(log, rep, end, unsettled)
	return nil
}

// stopBudget is how long a stop may take with shutdown_timeout d: the
// event queues' quiesce (2 s), d (the rescan of lost events and the
// writeback share it), and 15 s for the rest (closing the watcher, the
// report). It is sent to systemd as EXTEND_TIMEOUT_USEC with STOPPING=1
// (sd_notify(3)).
func stopBudget(d time.Duration) time.Duration { return d + 17*time.Second }

// logShutdown logs what the shutdown could not write, each device's files
// (the first 20 by name), and a last line that says exactly what was left
// and why: files whose data was lost to a failed writeback (rep.Lost),
// files given up because their filesystem cannot be written or the daemon
// may not open them (rep.GivenUp), and files still dirty when end (the
// deadline, or a second signal) cut the writeback short (rep.Left). end
// is named only when files were left.
//
// unsettled is the watcher's Settle error: when events were lost and could
// not be made up for, "every tracked file is clean" would say less than
// it seems to; the last line is an error that says so instead.
func logShutdown(log *zap.Logger, rep bdi.ShutdownReport, end string, unsettled error) {
	quote := func(paths []string) []string {
		out := make([]string, 0, min(len(paths), 20))
		for _, p := range paths[:min(len(paths), 20)] {
			out = append(out, strconv.Quote(p))
		}
		return out
	}
	// byError logs files by device and error, one line each, with the
	// message msg gives for the error; it returns how many files.
	byError := func(files map[string][]bdi.GivenUp, msg func(error) string) int {
		n := 0
		for dev, g := range files {
			n += len(g)
			paths := map[string][]string{}
			first := map[string]error{}
			for _, f := range g {
				e := f.Err.Error()
				paths[e] = append(paths[e], f.Path)
				if first[e] == nil {
					first[e] = f.Err
				}
			}
			for e, ps := range paths {
				log.Error(msg(first[e]), zap.String("bdi", dev), zap.String("error", e), zap.Int("files", len(ps)), zap.Strings("first", quote(ps)))
			}
		}
		return n
	}
	lost := byError(rep.Lost, func(error) string {
		return "shutdown: files whose data was lost to a failed writeback (not on disk; flusherd dirty listed them as failed, counted in failed_files)"
	})
	given := byError(rep.GivenUp, func(err error) string {
		if errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM) {
			return "shutdown: files given up, the daemon may not open or inspect them (whatever dirty data they hold is left to the kernel's flusher)"
		}
		return "shutdown: files given up, their filesystem cannot be written (their dirty data cannot reach the disk)"
	})
	left := 0
	for dev, paths := range rep.Left {
		left += len(paths)
		log.Error("shutdown: files still dirty or under writeback when "+end+" (the kernel's flusher writes back what it can)",
			zap.String("bdi", dev), zap.Int("files", len(paths)), zap.Strings("first", quote(paths)))
	}
	switch {
	case lost == 0 && given == 0 && left == 0 && unsettled != nil:
		log.Error("exiting: the tracked files are clean, but files in the trees may be dirty and untracked", zap.Error(unsettled))
	case lost == 0 && given == 0 && left == 0:
		log.Info("every tracked file is clean; exiting")
	default:
		fields := []zap.Field{zap.Int("data_lost", lost), zap.Int("given_up", given), zap.Int("still_dirty", left)}
		if left > 0 {
			fields = append(fields, zap.String("ended_by", end))
		}
		if unsettled != nil {
			fields = append(fields, zap.NamedError("untracked", unsettled))
		}
		log.Error("exiting with files not written back", fields...)
	}
}

// watchErrors holds the filesystem of an integrity tree open for its
// writeback errors (bdi.ErrWatch).
func watchErrors(errs *bdi.ErrWatch, t watch.Tree, log *zap.Logger) {
	if !t.Integrity {
		return
	}
	if _, err := errs.Add(t.Root); err != nil {
		log.Warn("integrity tree: cannot hold its filesystem open for writeback errors; an error another process's fsync took first may be missed",
			zap.String("root", strconv.Quote(t.Root)), zap.Error(err))
	}
}
