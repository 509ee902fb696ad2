package service

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"flusherd/bdi"
	"flusherd/config"
	"flusherd/inode"
	"flusherd/internal/logpath"
	"flusherd/policy"
	"flusherd/tree"
	"flusherd/watch"
)

// Daemon is a running flusherd's lifecycle: the configuration it serves,
// its trees, and the parts it drives. cmd/flusherd builds the parts; the
// calls go Start, Ready, Serve, Shutdown, on one goroutine.
type Daemon struct {
	Config *config.Config
	Trees  []tree.Tree // served, as resolved when added
	// Load reads and validates the configuration (SIGHUP); a watch path
	// whose root cannot be reached for its filesystem's sake is not a
	// problem where keep says so (config.LoadKeeping).
	Load    func(keep func(root string, err error) bool) (*config.Config, error)
	Reg     *bdi.Registry
	Wat     watch.Backend
	Handles *inode.Handles
	Errs    *bdi.ErrWatch
	Claims  *TreeClaims     // the trees' roots claimed on the host (nil: none)
	Level   zap.AtomicLevel // log.level, set again by a reload
	Notify  *Notifier
	Log     *zap.Logger
	Clock   Clock
	Socket  string // the control socket's path, for the log

	cancel   context.CancelFunc // ends Start's context
	watched  chan struct{}      // closed when the watcher's Run returned
	scanned  chan struct{}      // closed when the initial scan ended
	stopScan context.CancelFunc
	ready    atomic.Bool // the initial scan went through every tree
}

// Readiness is /readyz: nil once the initial scan has gone through every
// tree (Ready), else why not.
func (d *Daemon) Readiness() error {
	if !d.ready.Load() {
		return errors.New("the initial scan is running")
	}
	return nil
}

// Start runs the watcher's event loop and watches every root
// (watch.Backend.WatchRoots), stopping between two roots when stop ends
// (a signal during start-up: go to Shutdown then, not Ready). The context
// it returns ends when the shutdown closes the watcher; serve the control
// socket and the metrics with it. On error, everything is stopped, the
// registry too.
func (d *Daemon) Start(stop context.Context) (context.Context, error) {
	ctx, cancel := context.WithCancel(context.Background())
	d.cancel, d.watched = cancel, make(chan struct{})
	// Events are read while the initial scan runs, so the queue cannot
	// overflow during a long scan.
	go func() { defer close(d.watched); d.Wat.Run(ctx) }()
	if err := d.Wat.WatchRoots(stop); err != nil {
		cancel()
		d.Wat.Close()
		<-d.watched
		d.Reg.Stop()
		return nil, err
	}
	return ctx, nil
}

// Ready tells systemd READY=1 (every root is watched), then runs the
// initial scan, its progress in STATUS= every 2 s. ctx is Start's.
func (d *Daemon) Ready(ctx context.Context) {
	// READY=1 goes first, so the scan's last STATUS= is never followed
	// by an older one.
	ready := "every root is watched (the initial scan goes on)"
	if os.Getenv("NOTIFY_SOCKET") != "" {
		ready = "every root is watched; READY=1 (the initial scan goes on)"
	}
	wat, reg, log, n := d.Wat, d.Reg, d.Log, d.Notify
	log.Info(ready, zap.String("backend", wat.Name()))
	n.Send(fmt.Sprintf("READY=1\nSTATUS=watching %s (%s); initial scan running", Plural(len(d.Trees), "tree", "trees"), wat.Name()))
	scanCtx, stopScan := context.WithCancel(ctx)
	d.scanned, d.stopScan = make(chan struct{}), stopScan
	// Taken now: a reload replaces the configuration and the trees
	// while the scan runs.
	statsDir, ntrees, sock, scanned := d.Config.Stats.Dir, len(d.Trees), d.Socket, d.scanned
	go func() {
		defer close(scanned)
		wat.Scan(scanCtx)
		WriteWatchStats(statsDir, wat, log)
		if scanCtx.Err() != nil {
			return
		}
		d.ready.Store(true)
		log.Info("initial scan done; ready", zap.Uint64("directories", wat.ScannedDirs()),
			zap.Int("devices", len(reg.Devices())), logpath.String("socket", sock))
		if ntrees == 0 {
			n.Send("STATUS=idle: no [[watch]] entries configured")
		} else {
			n.Send(fmt.Sprintf("STATUS=watching %s (%s); initial scan done: %s", Plural(ntrees, "tree", "trees"), wat.Name(), Plural(wat.ScannedDirs(), "directory", "directories")))
		}
	}()
	go n.Progress(scanned, 2*time.Second, func() string {
		return fmt.Sprintf("STATUS=watching %s (%s); initial scan: %s scanned", Plural(ntrees, "tree", "trees"), wat.Name(), Plural(wat.ScannedDirs(), "directory", "directories"))
	})
}

// Serve reloads the configuration on SIGHUP (Reload, retried on a
// shortage: ServeSignals) until SIGTERM or SIGINT, which it returns.
func (d *Daemon) Serve(sigs <-chan os.Signal) os.Signal {
	return ServeSignals(d.Clock, sigs, d.Reload, func() (time.Duration, time.Duration) {
		return d.Config.Writeback.MinPause, d.Config.Writeback.MaxPause
	}, d.Log)
}

// Shutdown is the stop for sig (Stop.Run): every tracked file written back
// within shutdown_timeout, or until a second signal on sigs.
func (d *Daemon) Shutdown(sig os.Signal, sigs <-chan os.Signal) {
	scanned, stopScan, cut := d.scanned, d.stopScan, error(nil)
	if scanned == nil {
		// Stopped during start-up: Ready, and its scan, never ran.
		done := make(chan struct{})
		close(done)
		scanned, stopScan = done, func() {}
		cut = errors.New("the signal came during start-up, before the initial scan: files dirtied before then are not tracked and may be dirty")
		d.Log.Info("signal received during start-up; stopping", zap.String("signal", sig.String()))
	}
	s := Stop{
		Timeout: d.Config.Writeback.ShutdownTimeout, Signals: sigs, Notify: d.Notify, Log: d.Log,
		Scanned: scanned, StopScan: stopScan, Cut: cut, Quiesce: d.Wat.Quiesce, Settle: d.Wat.Settle,
		Close:     func() { d.cancel(); d.Wat.Close(); <-d.watched },
		Writeback: d.Reg.Shutdown,
		// With the shutdown's rescans.
		Finish: func() { WriteWatchStats(d.Config.Stats.Dir, d.Wat, d.Log) },
	}
	s.Run(sig)
}

// SetUpTrees prepares the configured trees before the watcher is made: it
// logs each with its settings (and a filesystem without writeback),
// registers its mount for opens by handle, holds an integrity tree's
// filesystem for its writeback errors, and counts it in start.
func SetUpTrees(trees []tree.Tree, handles *inode.Handles, errs *bdi.ErrWatch, start *Startup, log *zap.Logger) {
	if err := inode.ProbeOpenat2(); err != nil {
		log.Info("openat2(2) is refused (under systemd, RestrictSUIDSGID=yes does this): paths in the trees are resolved one component at a time with openat(2) and O_NOFOLLOW instead",
			zap.Error(err))
	}
	if len(trees) == 0 {
		log.Warn("no [[watch]] entries in the configuration: idle until a tree is added and the configuration reloaded (SIGHUP; systemctl reload flusherd)")
	}
	for _, t := range trees {
		log.Info("watching", logpath.String("root", t.Root), zap.Bool("recursive", t.Recursive),
			zap.Bool("integrity", t.Integrity()), zap.Stringer("expire", t.Expire))
		if kind, ok := watch.NoWriteback(t.Root); ok {
			log.Warn("this tree is on a filesystem without writeback: its files have no backing store and there is never anything to write back",
				logpath.String("root", t.Root), zap.String("fstype", kind))
		}
		if _, err := handles.AddMount(t.Root); err != nil {
			log.Info("files of this tree are opened by path, not by file handle", logpath.String("root", t.Root), zap.Error(err))
		}
		WatchErrors(errs, t, log)
		start.SetUp()
	}
}

// WatchErrors holds the filesystem of an integrity tree open for its
// writeback errors (bdi.ErrWatch), unless it has no writeback (a tmpfs:
// watch.NoWriteback), which would only keep it from being unmounted.
func WatchErrors(errs *bdi.ErrWatch, t tree.Tree, log *zap.Logger) {
	if !t.Integrity() {
		return
	}
	if _, none := watch.NoWriteback(t.Root); none {
		return
	}
	if _, err := errs.Add(t.Root); err != nil {
		log.Warn("integrity tree: cannot hold its filesystem open for writeback errors; an error another process's fsync took first may be missed",
			logpath.String("root", t.Root), zap.Error(err))
	}
}

// WriteWatchStats writes <dir>/watch/stats now (watch.WriteStats); a
// failure is logged.
func WriteWatchStats(dir string, wat watch.Backend, log *zap.Logger) {
	if err := watch.WriteStats(dir, wat.Name(), wat.Counters(), wat.Trees()); err != nil {
		log.Warn("cannot write the watch stats file", zap.Error(err))
	}
}

// TreesOf resolves the configuration's watch roots (symlinks in them are
// resolved once, here).
func TreesOf(cfg *config.Config) ([]tree.Tree, error) { return treesOf(cfg, nil) }

// treesOf is TreesOf; the roots in asIs (served already, and that cannot
// be reached) are taken as they are.
func treesOf(cfg *config.Config, asIs map[string]error) ([]tree.Tree, error) {
	trees := make([]tree.Tree, 0, len(cfg.Watch))
	for _, w := range cfg.Watch {
		t := w.Tree
		if _, ok := asIs[filepath.Clean(t.Root)]; ok {
			t.Root = filepath.Clean(t.Root)
			trees = append(trees, t)
			continue
		}
		root, err := filepath.EvalSymlinks(t.Root)
		if err != nil {
			return nil, fmt.Errorf("watch %s: %w", strconv.Quote(t.Root), err)
		}
		t.Root = root
		trees = append(trees, t)
	}
	return trees, nil
}

// BdiConfig maps the [writeback] and [plug] tables to a device's tunables.
func BdiConfig(cfg *config.Config) bdi.Config {
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
		TargetLatency:          cfg.Writeback.TargetLatency,
		DirtyBackgroundBytes:   cfg.Writeback.DirtyBackgroundBytes,
		DirtyBackgroundRatio:   cfg.Writeback.DirtyBackgroundRatio,
		RangeBytes:             cfg.Writeback.RangeBytes,
		Requeue:                req,
		PlugEnabled:            cfg.Plug.Enabled,
		MaxPending:             cfg.Plug.MaxPending,
		QueueDepth:             cfg.Plug.QueueDepth,
		IntegritySyncfs:        cfg.Plug.IntegritySyncfs,
		AttemptTimeout:         cfg.Writeback.AttemptTimeout,
		SweepInterval:          SweepInterval(cfg),
	}
}

// SweepInterval is watcher.sweep_interval as bdi.Config takes it:
// policy.SweepAuto for "auto", 0 for off.
func SweepInterval(cfg *config.Config) time.Duration {
	if cfg.Watcher.SweepAuto {
		return policy.SweepAuto
	}
	return cfg.Watcher.SweepInterval
}
