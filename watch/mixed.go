package watch

import (
	"context"
	"errors"
	"sync"

	"go.uber.org/zap"

	"flusherd/bdi"
	"flusherd/internal/logpath"
	"flusherd/tree"
)

// Mixed serves each tree with the backend its filesystem allows, at once:
// fanotify for the filesystems that accept a mark and opens by handle,
// inotify for the others (a FUSE filesystem without file handles, a
// filesystem fanotify refuses), trees added by a reload included. It is
// what backend = "auto" gives when fanotify is available. The two halves
// share one Counters and write one watch/stats, whose backend line is
// Name(): "fanotify" or "inotify" while one half serves every tree,
// "fanotify+inotify" while both serve some; the log says which tree uses
// which.
type Mixed struct {
	fa *Fanotify
	in *Watcher
}

var _ Backend = (*Mixed)(nil)

func newMixed(fa *Fanotify, in *Watcher) *Mixed {
	m := &Mixed{fa: fa, in: in}
	in.ctr = fa.ctr
	fa.statsName, in.statsName = m.Name, m.Name
	fa.statsTrees, in.statsTrees = m.Trees, m.Trees
	fa.nestedFallback = in.serveNested
	return m
}

// Observer implements Backend: the fanotify half's.
func (m *Mixed) Observer() bdi.AttemptObserver { return m.fa.Observer() }

// Name implements Backend: the halves that serve trees now.
func (m *Mixed) Name() string {
	fa, in := len(m.fa.list()) > 0, len(m.in.list()) > 0
	switch {
	case fa && in:
		return "fanotify+inotify"
	case in:
		return "inotify"
	}
	return "fanotify"
}

// Start implements Backend: WatchRoots, then Scan.
func (m *Mixed) Start(ctx context.Context) error {
	if err := m.WatchRoots(ctx); err != nil {
		return err
	}
	m.Scan(ctx)
	return nil
}

// WatchRoots implements Backend.
func (m *Mixed) WatchRoots(ctx context.Context) error {
	return errors.Join(m.fa.WatchRoots(ctx), m.in.WatchRoots(ctx))
}

// Scan implements Backend.
func (m *Mixed) Scan(ctx context.Context) {
	m.fa.Scan(ctx)
	m.in.Scan(ctx)
}

// ScannedDirs implements Backend.
func (m *Mixed) ScannedDirs() uint64 { return m.fa.ScannedDirs() + m.in.ScannedDirs() }

// AddTree implements Backend: fanotify if the tree's filesystem takes the
// mark, else inotify.
func (m *Mixed) AddTree(ctx context.Context, t tree.Tree) error {
	err := m.fa.AddTree(ctx, t)
	if err == nil {
		return nil
	}
	m.fa.log.Info(fanotifyRefused(err), logpath.String("root", t.Root), zap.Error(err))
	return m.in.AddTree(ctx, t)
}

// RemoveTree implements Backend. Mounts inside the tree that the inotify
// half serves for the fanotify half go with it.
func (m *Mixed) RemoveTree(root string) bool {
	a := m.fa.RemoveTree(root)
	b := m.in.RemoveTree(root)
	for _, t := range m.in.list() {
		if t.nestedIn == root {
			m.in.RemoveTree(t.Root)
		}
	}
	return a || b
}

// Served implements Backend.
func (m *Mixed) Served(root string) bool { return m.fa.Served(root) || m.in.Served(root) }

// Run implements Backend: both halves, until ctx ends or Close.
func (m *Mixed) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { m.fa.Run(ctx) })
	wg.Go(func() { m.in.Run(ctx) })
	wg.Wait()
}

// Fence implements Backend: both halves'.
func (m *Mixed) Fence(ctx context.Context) error {
	if err := m.fa.Fence(ctx); err != nil {
		return err
	}
	return m.in.Fence(ctx)
}

// Quiesce implements Backend.
func (m *Mixed) Quiesce(ctx context.Context) {
	m.fa.Quiesce(ctx)
	m.in.Quiesce(ctx)
}

// Settle implements Backend.
func (m *Mixed) Settle(ctx context.Context) error {
	return errors.Join(m.fa.Settle(ctx), m.in.Settle(ctx))
}

// Close implements Backend.
func (m *Mixed) Close() error { return errors.Join(m.fa.Close(), m.in.Close()) }

// Counters implements Backend: the two halves' shared counters.
func (m *Mixed) Counters() *Counters { return m.fa.Counters() }

// TreeOf implements Backend: the deepest tree of either half.
func (m *Mixed) TreeOf(path string) (tree.Tree, bool) {
	a, okA := m.fa.TreeOf(path)
	b, okB := m.in.TreeOf(path)
	switch {
	case okA && okB:
		if len(b.Root) > len(a.Root) {
			return b, true
		}
		return a, true
	case okA:
		return a, true
	}
	return b, okB
}

// OnDevice implements Backend: either half's.
func (m *Mixed) OnDevice(dev uint64) bool { return m.fa.OnDevice(dev) || m.in.OnDevice(dev) }

// Trees implements Backend: the fanotify half's trees, then the inotify
// half's.
func (m *Mixed) Trees() []TreeUse { return append(m.fa.Trees(), m.in.Trees()...) }
