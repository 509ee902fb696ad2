package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"flusherd/bdi"
	"flusherd/config"
	"flusherd/inode"
	"flusherd/policy"
	"flusherd/service"
	"flusherd/watch"
)

// underSystemd reports whether flusherd runs as a systemd service
// ($INVOCATION_ID, set by systemd for each unit's processes:
// systemd.exec(5)).
func underSystemd() bool { return os.Getenv("INVOCATION_ID") != "" }

// notifier sends sd_notify(3) messages to $NOTIFY_SOCKET (nothing when it
// is unset: not started by systemd) and logs the first failure only.
type notifier struct {
	log    *zap.Logger
	failed sync.Once
}

func (n *notifier) send(state string) {
	if _, err := daemon.SdNotify(false, state); err != nil {
		n.failed.Do(func() { n.log.Warn("sd_notify failed", zap.Error(err)) })
	}
}

// extendWhile sends EXTEND_TIMEOUT_USEC=extend and STATUS=status() every
// `every` until the returned stop is called, as long as progress() has
// moved since the previous message (or this is the first): a start-up that
// makes progress is never cut off by TimeoutStartSec, and one that hangs
// still is. stop is idempotent.
func (n *notifier) extendWhile(every, extend time.Duration, status func() string, progress func() int64) (stop func()) {
	done := make(chan struct{})
	var once sync.Once
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		last := int64(-1)
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			p := progress()
			if p == last && last >= 0 {
				continue
			}
			last = p
			n.send(fmt.Sprintf("EXTEND_TIMEOUT_USEC=%d\nSTATUS=%s", extend.Microseconds(), status()))
		}
	}()
	return func() { once.Do(func() { close(done) }) }
}

// progress sends status() every `every` until done is closed.
func (n *notifier) progress(done <-chan struct{}, every time.Duration, status func() string) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
			n.send(status())
		}
	}
}

// watchdogLoop pings the systemd watchdog (WATCHDOG=1) every interval/2
// while every device's writeback goroutine is healthy (bdi.Writeback.
// Healthy with the watchdog interval as the limit): a wedged goroutine
// stops the pings, and systemd restarts the service. Writeback calls stuck
// in the kernel (a frozen filesystem) do not stop them: they are given up
// on after attempt_timeout, and reported in STATUS= and in each device's
// stuck_calls.
func watchdogLoop(ctx context.Context, interval time.Duration, reg *bdi.Registry, n *notifier, log *zap.Logger) {
	t := time.NewTicker(interval / 2)
	defer t.Stop()
	wedged := ""
	lastStatus := ""
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sick := ""
		status := ""
		for _, wb := range reg.Devices() {
			if !wb.Healthy(interval) && sick == "" {
				sick = wb.Name
			}
			if k := wb.StuckCalls(); k > 0 {
				status += fmt.Sprintf("bdi %s: %d writeback calls stuck past attempt_timeout (frozen or hung filesystem?); ", wb.Name, k)
			}
		}
		if sick != "" {
			if wedged != sick {
				log.Error("a device's writeback goroutine shows no sign of life; not pinging the watchdog", zap.String("bdi", sick), zap.Stringer("limit", interval))
				n.send("STATUS=writeback goroutine of bdi " + sick + " is wedged")
			}
			wedged = sick
			continue
		}
		wedged = ""
		if status != lastStatus {
			if status == "" {
				n.send("STATUS=running")
			} else {
				n.send("STATUS=" + status)
			}
			lastStatus = status
		}
		n.send(daemon.SdNotifyWatchdog)
	}
}

// monotonicUsec is CLOCK_MONOTONIC in microseconds, for RELOADING=1.
func monotonicUsec() int64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano() / 1000
}

// reloadConfig is SIGHUP: RELOADING=1, then the new configuration is read
// and validated; if it is good, the tunables go to the running devices and
// watch roots are added and removed (a removed root's files are written
// back once and forgotten); READY=1 ends it either way. It returns the new
// configuration, or nil when it was rejected (the old one keeps running).
// stats.dir, watcher.backend and metrics.listen take effect at the next
// start only; that is logged.
//
// running are the trees being served, as resolved when they were added; a
// tree whose root is gone (removed, unmounted) is added again if the new
// configuration still has it and its root is back.
func reloadConfig(old *config.Config, running []watch.Tree, reload func() (*config.Config, error), reg *bdi.Registry, wat watch.Backend,
	handles *inode.Handles, errs *bdi.ErrWatch, level zap.AtomicLevel, n *notifier, log *zap.Logger) (_ *config.Config, _ []watch.Tree, short bool) {
	n.send(fmt.Sprintf("RELOADING=1\nMONOTONIC_USEC=%d", monotonicUsec()))
	defer n.send("READY=1")
	cfg, err := reload()
	var trees []watch.Tree
	if err == nil {
		trees, err = treesOf(cfg)
	}
	if err != nil {
		if policy.Shortage(err) {
			log.Debug("configuration reload could not read the file for want of resources", zap.Error(err))
			return nil, running, true
		}
		log.Error("configuration reload rejected; the running configuration is unchanged", zap.Error(err))
		n.send("STATUS=reload rejected: " + err.Error())
		return nil, running, false
	}
	for _, c := range []struct {
		key, running, configured string
		keep                     func() // sets cfg's to the running value
	}{
		{"stats.dir", old.Stats.Dir, cfg.Stats.Dir, func() { cfg.Stats.Dir = old.Stats.Dir }},
		{"watcher.backend", old.Watcher.Backend, cfg.Watcher.Backend, func() { cfg.Watcher.Backend = old.Watcher.Backend }},
		{"watcher.rescan_interval", old.Watcher.RescanInterval.String(), cfg.Watcher.RescanInterval.String(),
			func() { cfg.Watcher.RescanInterval = old.Watcher.RescanInterval }},
		{"metrics.listen", old.Metrics.Listen, cfg.Metrics.Listen, func() { cfg.Metrics.Listen = old.Metrics.Listen }},
	} {
		if c.running != c.configured {
			log.Warn("this setting changes at the next start, not on reload", zap.String("key", c.key),
				zap.String("running", c.running), zap.String("configured", c.configured))
			// What runs is what later reloads compare with.
			c.keep()
		}
	}
	if l, err := zap.ParseAtomicLevel(cfg.Log.Level); err == nil {
		level.SetLevel(l.Level())
	}
	reg.SetConfig(bdiConfig(cfg))

	plan := service.PlanTrees(running, trees, wat.Served)
	added, removed := 0, len(plan.Retire)
	// Retired roots leave the watcher first, so that a file of theirs is
	// kept only if another tree (one replaced included) still holds it.
	for _, t := range plan.Retire {
		wat.RemoveTree(t.Root)
		errs.Remove(t.Root)
	}
	for _, t := range plan.Retire {
		k := reg.TreeRemoved(t.Root, func(p string) bool { _, in := wat.TreeOf(p); return in })
		log.Info("watch root removed; its tracked files are written back once more (a large one write_chunk at a time) and forgotten",
			zap.String("root", strconv.Quote(t.Root)), zap.Int("files", k))
	}
	for _, t := range plan.Replace {
		// Taken out and put back with its new settings below.
		wat.RemoveTree(t.Root)
		errs.Remove(t.Root)
	}
	served := plan.Keep
	for _, t := range plan.Add {
		root := t.Root
		if _, err := handles.AddMount(root); policy.Shortage(err) {
			// Not served yet: the retried reload adds it.
			short = true
			continue
		} else if err != nil {
			log.Info("files of this tree are opened by path, not by file handle", zap.String("root", strconv.Quote(root)), zap.Error(err))
		}
		if err := wat.AddTree(context.Background(), t); err != nil {
			if policy.Shortage(err) {
				short = true
				continue
			}
			log.Error("cannot watch a root added by the reload", zap.String("root", strconv.Quote(root)), zap.Error(err))
			continue
		}
		watchErrors(errs, t, log)
		served = append(served, t)
		// As the start-up "watching" line: the tree's settings too.
		fields := []zap.Field{zap.String("root", strconv.Quote(root)), zap.Bool("recursive", t.Recursive),
			zap.Bool("integrity", t.Integrity), zap.Stringer("expire", t.Expire)}
		switch {
		case plan.Returned(root):
			log.Info("watch root served again (it was gone)", fields...)
		case plan.Replaced(root):
			log.Info("watch root settings changed", fields...)
		default:
			log.Info("watch root added", fields...)
			added++
		}
	}
	// Files tracked already take the settings of the tree that holds
	// them now where those are stricter (a shorter expire, integrity): a
	// tree changed, a tree added inside another, or a tree made
	// non-recursive, whose subdirectories the tree around it holds now.
	restricted := 0
	for _, t := range served {
		root := t.Root
		restricted += reg.TreeRestricted(root, t.Tree, func(p string) bool { h, ok := wat.TreeOf(p); return ok && h.Root == root })
	}
	log.Info("configuration reloaded", zap.Int("roots_added", added), zap.Int("roots_removed", removed), zap.Int("tracked_files", restricted),
		zap.Stringer("dirty_writeback_interval", cfg.Writeback.DirtyWritebackInterval))
	if len(served) == 0 {
		if len(running) > 0 {
			log.Warn("the reloaded configuration leaves no tree watched: idle until a tree is added and the configuration reloaded (SIGHUP; systemctl reload flusherd)",
				zap.Int("trees_before", len(running)))
		}
		n.send("STATUS=idle: no [[watch]] entries configured; configuration reloaded")
	} else {
		n.send(fmt.Sprintf("STATUS=watching %s (%s); configuration reloaded", plural(len(served), "tree", "trees"), wat.Name()))
	}
	return cfg, served, short
}
