package service

import (
	"os"

	"flusherd/bdi"
	"flusherd/control"
	"flusherd/watch"
)

// StatusOf is the "status" answer: each tree the watcher has (its settings,
// and its figures over every device: bdi.Registry.TreeTotals), then each
// device's figures (its stats file's).
func StatusOf(reg *bdi.Registry, wat watch.Backend) control.Status {
	page := uint64(os.Getpagesize())
	uses := wat.Trees()
	roots := make([]string, len(uses))
	for i, u := range uses {
		roots[i] = u.Root
	}
	now := reg.Now()
	st := control.Status{Trees: []control.TreeStatus{}, Devices: []control.DeviceStatus{}}
	for i, t := range reg.TreeTotals(roots) {
		u := uses[i]
		ts := control.TreeStatus{Root: control.Name(u.Root), Backend: u.Backend, Served: u.Served,
			Tracked: t.Tracked, Dirty: t.Dirty, DirtyBytes: t.DirtyPages * page, WritebackBytes: t.WritebackPages * page,
			WrittenBytes: t.Written * page, Errors: t.Errors, Blocked: t.Blocked, Failed: t.Failed}
		// Its own settings, a tree whose root is gone's too.
		ts.Mode, ts.ExpireSeconds = string(u.Tree.Mode), u.Tree.Expire.Seconds()
		if ts.Mode == "" {
			ts.Mode = "writeback"
		}
		ts.OldestDirtySeconds = t.OldestAge(now).Seconds()
		e := t.Exposure(now)
		ts.Exposure = control.Exposure{Count: e.RecentCount, P50Seconds: e.P50, P99Seconds: e.P99, MaxSeconds: e.MaxRecent}
		st.Trees = append(st.Trees, ts)
	}
	for _, wb := range reg.Devices() {
		s := reg.Snapshot(wb)
		st.Devices = append(st.Devices, control.DeviceStatus{Bdi: wb.Name, Tracked: s.Tracked(),
			DirtyBytes: s.BdiReclaimable * page, WritebackBytes: s.BdiWriteback * page,
			WindowBytes: s.InflightWindowBytes, PaceBytesPerSec: s.PaceKBps * 1024, WrittenBytes: s.BdiWritten * page,
			Errors: s.WritebackErrors, FailedFiles: s.FailedFiles, StuckCalls: s.StuckCalls, Probing: s.Probing != 0,
			SweepCandidates: s.SweepCandidates, SweepFound: s.SweepFound})
	}
	return st
}
