package service

import (
	"maps"
	"slices"

	"flusherd/watch"
)

// TreePlan is what a configuration reload does to the watched trees
// (PlanTrees). Each list is in root order.
type TreePlan struct {
	// Keep: configured before and now with the same settings, and
	// served: left alone.
	Keep []watch.Tree
	// Retire: no longer configured: taken out of the watcher, their
	// tracked files written back once and forgotten.
	Retire []watch.Tree
	// Replace: configured still, but with other settings or not served
	// any more (gone, and maybe back): taken out of the watcher and
	// added again (they are in Add too, with their new settings).
	Replace []watch.Tree
	// Add: to be watched: new roots and those of Replace.
	Add []watch.Tree
}

// PlanTrees compares the trees served before a reload (running, as
// resolved when they were added) with those of the new configuration
// (configured), given which roots the watcher serves now (served).
func PlanTrees(running, configured []watch.Tree, served func(root string) bool) TreePlan {
	was := map[string]watch.Tree{}
	for _, t := range running {
		was[t.Root] = t
	}
	now := map[string]watch.Tree{}
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
