package bdi

import (
	"sync/atomic"

	"flusherd/inode"
)

// AttemptObserver is told what a device does with the files it opens:
// the fanotify watcher uses it to stop and restart the reports of a file
// written continually (watch.Fanotify). Registry.Observe subscribes one.
type AttemptObserver interface {
	// Opened: f was just opened for a writeback attempt of the inode
	// key, which has not read its state yet.
	Opened(key inode.Key, f inode.File)
	// Forgotten: the device forgot the inode key (clean, gone, or its
	// tree no longer served) or parked it as failed (only a new write
	// revives it). Called with the list lock held: it must not block or
	// call into bdi.
	Forgotten(key inode.Key)
	// Checking: a background check of a device with range writeback or
	// a background threshold is taking the files written since the last
	// one; every file's next write must be reported.
	Checking()
}

// subscription is a Registry's AttemptObserver, shared by its devices:
// it tells the one Observe set, if any.
type subscription struct {
	o atomic.Pointer[AttemptObserver]
}

func (s *subscription) set(o AttemptObserver) {
	if o == nil {
		s.o.Store(nil)
		return
	}
	s.o.Store(&o)
}

// Opened implements AttemptObserver.
func (s *subscription) Opened(key inode.Key, f inode.File) {
	if p := s.o.Load(); p != nil {
		(*p).Opened(key, f)
	}
}

// Forgotten implements AttemptObserver.
func (s *subscription) Forgotten(key inode.Key) {
	if p := s.o.Load(); p != nil {
		(*p).Forgotten(key)
	}
}

// Checking implements AttemptObserver.
func (s *subscription) Checking() {
	if p := s.o.Load(); p != nil {
		(*p).Checking()
	}
}
