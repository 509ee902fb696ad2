package service

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"go.uber.org/zap"

	"flusherd/config"
	"flusherd/internal/logpath"
	"flusherd/policy"
	"flusherd/tree"
)

// TreePlan is what a configuration reload does to the watched trees
// (PlanTrees). Each list is in root order.
type TreePlan struct {
	// Keep: configured before and now with the same settings, and
	// served: left alone.
	Keep []tree.Tree
	// Retire: no longer configured: taken out of the watcher, their
	// tracked files written back once and forgotten.
	Retire []tree.Tree
	// Replace: configured still, but with other settings or not served
	// any more (gone, and maybe back): taken out of the watcher and
	// added again (they are in Add too, with their new settings).
	Replace []tree.Tree
	// Add: to be watched: new roots and those of Replace.
	Add []tree.Tree
}

// PlanTrees compares the trees served before a reload (running, as
// resolved when they were added) with those of the new configuration
// (configured), given which roots the watcher serves now (served).
func PlanTrees(running, configured []tree.Tree, served func(root string) bool) TreePlan {
	was := map[string]tree.Tree{}
	for _, t := range running {
		was[t.Root] = t
	}
	now := map[string]tree.Tree{}
	for _, t := range configured {
		now[t.Root] = t
	}
	var p TreePlan
	for _, root := range slices.Sorted(maps.Keys(was)) {
		if t, ok := now[root]; ok && t == was[root] && served(root) {
			p.Keep = append(p.Keep, t)
			continue
		}
		if _, ok := now[root]; ok {
			p.Replace = append(p.Replace, was[root])
		} else {
			p.Retire = append(p.Retire, was[root])
		}
	}
	for _, root := range slices.Sorted(maps.Keys(now)) {
		if t, ok := was[root]; ok && t == now[root] && served(root) {
			continue
		}
		p.Add = append(p.Add, now[root])
	}
	return p
}

// Replaced reports whether root is in Replace (so that an Add of it is a
// change of settings or a return, not a new root).
func (p TreePlan) Replaced(root string) bool {
	for _, t := range p.Replace {
		if t.Root == root {
			return true
		}
	}
	return false
}

// Returned reports whether root is in Replace with the same settings as in
// Add: a root that was gone (removed, renamed or unmounted) and is served
// again, not one whose settings changed.
func (p TreePlan) Returned(root string) bool {
	for _, t := range p.Replace {
		if t.Root != root {
			continue
		}
		for _, a := range p.Add {
			if a.Root == root {
				return a == t
			}
		}
	}
	return false
}

// Reload is SIGHUP, between RELOADING=1 and READY=1 (sd_notify(3)): a
// good configuration goes to the devices and trees, a bad one is logged
// and the running one kept. short reports a shortage (EMFILE, ENOMEM)
// that kept it from completing, for ServeSignals to retry.
func (d *Daemon) Reload() (short bool) {
	cfg, trees, short := d.reloadConfig()
	if cfg != nil {
		d.Config, d.Trees = cfg, trees
		// Its tree: lines name the trees served now (the watcher
		// writes the file again only on its next event).
		WriteWatchStats(cfg.Stats.Dir, d.Wat, d.Log)
	}
	return short
}

// reloadConfig reads and applies the configuration. It returns it with
// the trees served now, or nil when it was rejected.
func (d *Daemon) reloadConfig() (_ *config.Config, _ []tree.Tree, short bool) {
	log, running := d.Log, d.Trees
	d.Notify.Send(fmt.Sprintf("RELOADING=1\nMONOTONIC_USEC=%d", d.Clock.MonotonicUsec()))
	defer d.Notify.Send("READY=1")
	// A tree served now whose root cannot be reached (its FUSE server
	// died, its filesystem was shut down) does not make the new
	// configuration invalid, as it does at start-up: it is kept as it
	// runs, and the rest is applied.
	unreachable := map[string]error{}
	cfg, err := d.Load(func(root string, err error) bool {
		if !slices.ContainsFunc(running, func(t tree.Tree) bool { return t.Root == root }) {
			return false
		}
		unreachable[root] = err
		return true
	})
	var trees []tree.Tree
	if err == nil {
		trees, err = treesOf(cfg, unreachable)
	}
	if err == nil {
		for i, t := range trees {
			rerr, ok := unreachable[t.Root]
			if !ok {
				continue
			}
			j := slices.IndexFunc(running, func(r tree.Tree) bool { return r.Root == t.Root })
			changed := trees[i] != running[j]
			trees[i] = running[j]
			log.Warn("a watched tree's root cannot be reached; the tree is kept as it runs, and the rest of the configuration applied",
				logpath.String("root", t.Root), zap.Bool("settings_changed_not_applied", changed), zap.Error(rerr))
		}
	}
	if err != nil {
		if policy.Shortage(err) {
			log.Debug("configuration reload could not read the file for want of resources", zap.Error(err))
			return nil, running, true
		}
		log.Error("configuration reload rejected; the running configuration is unchanged", zap.Error(err))
		d.Notify.Send("STATUS=reload rejected: " + err.Error())
		return nil, running, false
	}
	keepStartOnly(d.Config, cfg, log)
	if l, err := zap.ParseAtomicLevel(cfg.Log.Level); err == nil {
		d.Level.SetLevel(l.Level())
	}
	d.Reg.SetConfig(BdiConfig(cfg))
	d.Reg.SetMaxTracked(MaxTracked(cfg, GoMemoryLimit()))
	plan := PlanTrees(running, trees, d.Wat.Served)
	served, added, short := d.applyPlan(plan)
	// Files tracked already take the settings of the tree that holds
	// them now where those are stricter (a shorter expire, integrity): a
	// tree changed, a tree added inside another, or a tree made
	// non-recursive, whose subdirectories the tree around it holds now.
	restricted := 0
	for _, t := range served {
		root := t.Root
		restricted += d.Reg.TreeRestricted(root, t, func(p string) bool { h, ok := d.Wat.TreeOf(p); return ok && h.Root == root })
	}
	log.Info("configuration reloaded", zap.Int("roots_added", added), zap.Int("roots_removed", len(plan.Retire)), zap.Int("tracked_files", restricted),
		zap.Stringer("dirty_writeback_interval", cfg.Writeback.DirtyWritebackInterval))
	if len(served) == 0 {
		if len(running) > 0 {
			log.Warn("the reloaded configuration leaves no tree watched: idle until a tree is added and the configuration reloaded (SIGHUP; systemctl reload flusherd)",
				zap.Int("trees_before", len(running)))
		}
		d.Notify.Send("STATUS=idle: no [[watch]] entries configured; configuration reloaded")
	} else {
		d.Notify.Send(fmt.Sprintf("STATUS=watching %s (%s); configuration reloaded", Plural(len(served), "tree", "trees"), d.Wat.Name()))
	}
	return cfg, served, short
}

// keepStartOnly sets cfg's settings that change at the next start only to
// old's (what runs is what later reloads compare with), with a warning
// for each that differs.
func keepStartOnly(old, cfg *config.Config, log *zap.Logger) {
	for _, c := range []struct {
		key, running, configured string
		keep                     func() // sets cfg's to the running value
	}{
		{"stats.dir", old.Stats.Dir, cfg.Stats.Dir, func() { cfg.Stats.Dir = old.Stats.Dir }},
		{"watcher.backend", old.Watcher.Backend, cfg.Watcher.Backend, func() { cfg.Watcher.Backend = old.Watcher.Backend }},
		{"watcher.rescan_interval", old.Watcher.RescanInterval.String(), cfg.Watcher.RescanInterval.String(),
			func() { cfg.Watcher.RescanInterval = old.Watcher.RescanInterval }},
		{"watcher.sweep_interval", old.Watcher.SweepText(), cfg.Watcher.SweepText(),
			func() {
				cfg.Watcher.SweepInterval, cfg.Watcher.SweepAuto = old.Watcher.SweepInterval, old.Watcher.SweepAuto
			}},
		{"metrics.listen", old.Metrics.Listen, cfg.Metrics.Listen, func() { cfg.Metrics.Listen = old.Metrics.Listen }},
		{"log.format", old.Log.Format, cfg.Log.Format, func() { cfg.Log.Format = old.Log.Format }},
	} {
		if c.running != c.configured {
			log.Warn("this setting changes at the next start, not on reload", zap.String("key", c.key),
				logpath.String("running", c.running), logpath.String("configured", c.configured))
			c.keep()
		}
	}
}

// applyPlan carries out a reload's tree changes: a retired root's files
// are written back once and forgotten; replaced and new roots are added;
// a device no tree is on any more is retired (Registry.Retire).
// short: a shortage kept a root out (the retried reload adds it).
func (d *Daemon) applyPlan(plan TreePlan) (served []tree.Tree, added int, short bool) {
	log, wat := d.Log, d.Wat
	// Retired roots leave the watcher first, so that a file of theirs is
	// kept only if another tree (one replaced included) still holds it.
	for _, t := range plan.Retire {
		wat.RemoveTree(t.Root)
		d.Errs.Remove(t.Root)
		d.Claims.Release(t.Root)
		// Files are named through the trees served, not the retired
		// root's mount (a tree on a bind mount of its filesystem).
		d.Handles.Demote(t.Root)
	}
	for _, t := range plan.Retire {
		k := d.Reg.TreeRemoved(t.Root, func(p string) bool { _, in := wat.TreeOf(p); return in })
		log.Info("watch root removed; its tracked files are written back once more (a large one write_chunk at a time) and forgotten",
			logpath.String("root", t.Root), zap.Int("files", k))
	}
	for _, t := range plan.Replace {
		// Taken out and put back with its new settings below.
		wat.RemoveTree(t.Root)
		d.Errs.Remove(t.Root)
	}
	served = plan.Keep
	for _, t := range plan.Add {
		root := t.Root
		// A root left out is not served: its claim goes (a replaced
		// root's too).
		if err := d.claim(t); err != nil {
			d.Claims.Release(root)
			log.Error("cannot watch a root added by the reload", logpath.String("root", root), zap.Error(err))
			continue
		}
		if _, err := d.Handles.AddMount(root); policy.Shortage(err) {
			d.Claims.Release(root)
			short = true
			continue
		} else if err != nil {
			log.Info("files of this tree are opened by path, not by file handle", logpath.String("root", root), zap.Error(err))
		}
		if err := wat.AddTree(context.Background(), t); err != nil {
			d.Claims.Release(root)
			if policy.Shortage(err) {
				short = true
				continue
			}
			log.Error("cannot watch a root added by the reload", logpath.String("root", root), zap.Error(err))
			continue
		}
		WatchErrors(d.Errs, t, log)
		served = append(served, t)
		// As the start-up "watching" line: the tree's settings too.
		fields := []zap.Field{logpath.String("root", root), zap.Bool("recursive", t.Recursive),
			zap.Bool("integrity", t.Integrity()), zap.Stringer("expire", t.Expire)}
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
	if len(plan.Retire) > 0 || len(plan.Replace) > 0 {
		// A device no tree is on any more goes once its files are
		// written back, as one whose trees are gone.
		for _, dev := range d.Reg.StDevs() {
			unused := func() bool { return !wat.OnDevice(dev) }
			if unused() {
				d.Reg.Retire(dev, unused)
			}
		}
	}
	return served, added, short
}
