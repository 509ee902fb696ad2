package watch

import (
	"flusherd/bdi"
	"flusherd/inode"
	"flusherd/tree"
)

// partialSink is the least a test's fake sink implements.
type partialSink interface {
	MarkInodeDirty(path string, key inode.Key, h inode.Handle, t tree.Tree) error
	Tracks(key inode.Key, path string) bool
	Rescanned(dev uint64)
	TreeGone(root string, dev uint64, lastOnDev, unmounted bool)
}

// sinkOf makes the fake s a Sink. The methods s lacks answer as the
// watcher treated a sink without them before they were part of Sink:
// reports in a batch are made one by one with MarkInodeDirty (or
// MarkInodeClosed, if s has it), a removed tree's reports (Leaving) are
// dropped, TracksKey answers false, Unchecked true, and deletions and
// name checks are dropped.
func sinkOf(s partialSink) Sink {
	if full, ok := s.(Sink); ok {
		return full
	}
	return fakeSink{s}
}

type fakeSink struct{ partialSink }

func (f fakeSink) MarkInodesDirty(ms []bdi.Mark) {
	if b, ok := f.partialSink.(interface{ MarkInodesDirty([]bdi.Mark) }); ok {
		b.MarkInodesDirty(ms)
		return
	}
	closer, _ := f.partialSink.(interface {
		MarkInodeClosed(path string, key inode.Key, h inode.Handle, t tree.Tree) error
	})
	for i := range ms {
		m := &ms[i]
		switch {
		case m.Leaving:
		case m.Closed && closer != nil:
			m.Err = closer.MarkInodeClosed(m.Path, m.Key, m.Handle, m.Tree)
		default:
			m.Err = f.MarkInodeDirty(m.Path, m.Key, m.Handle, m.Tree)
		}
	}
}

func (f fakeSink) TracksKey(key inode.Key) bool {
	if t, ok := f.partialSink.(interface{ TracksKey(inode.Key) bool }); ok {
		return t.TracksKey(key)
	}
	return false
}

func (f fakeSink) InodeUnlinked(key inode.Key, h inode.Handle) {
	if u, ok := f.partialSink.(interface{ InodeUnlinked(inode.Key, inode.Handle) }); ok {
		u.InodeUnlinked(key, h)
	}
}

func (f fakeSink) NameUnlinked(key inode.Key, path string) {
	if u, ok := f.partialSink.(interface{ NameUnlinked(inode.Key, string) }); ok {
		u.NameUnlinked(key, path)
	}
}

func (f fakeSink) CheckNames(root string) {
	if c, ok := f.partialSink.(interface{ CheckNames(string) }); ok {
		c.CheckNames(root)
	}
}

func (f fakeSink) InodesOpened(os []bdi.Open) {
	if o, ok := f.partialSink.(interface{ InodesOpened([]bdi.Open) }); ok {
		o.InodesOpened(os)
	}
}

func (f fakeSink) Unchecked(dev uint64) bool {
	if u, ok := f.partialSink.(interface{ Unchecked(uint64) bool }); ok {
		return u.Unchecked(dev)
	}
	return true
}
