package policy

import "time"

// SweepAuto is the configured sweep interval that follows each tree's
// expire (SweepEvery).
const SweepAuto time.Duration = -1

// SweepEvery is how often a candidate of a tree with expire is looked at
// (watcher.sweep_interval): configured when positive, half the expire for
// SweepAuto (at least a millisecond), 0 when the sweep is off.
func SweepEvery(configured, expire time.Duration) time.Duration {
	switch {
	case configured > 0:
		return configured
	case configured == 0:
		return 0
	}
	return max(expire/2, time.Millisecond)
}

// Opens is a file's open count after an event that carries an open
// (FAN_OPEN, IN_OPEN) and/or closes (FAN_CLOSE_WRITE, FAN_CLOSE_NOWRITE:
// both, merged into one event, are two): one more for an open, one fewer
// per close, never below 0 (a close of an open made before the watch).
// An event that carries an open and closes was merged by the kernel from
// events of one process, whose number it does not keep: maybeLow says the
// count may be lower than the opens left (two opens merged into one).
func Opens(n int, open bool, closes int) (count int, maybeLow bool) {
	if open {
		n++
	}
	return max(n-closes, 0), open && closes > 0
}

// Writers is what a probe for writers of a file found (inode.HeldForWrite).
type Writers int8

const (
	// WritersUnknown: the probe could not tell (no lease permitted, a
	// filesystem without leases, a probe that did not return in time).
	WritersUnknown Writers = iota
	// WritersNone: no process holds the file open for writing or mapped
	// shared and writable.
	WritersNone
	// WritersSome: some process does.
	WritersSome
)

// OpenCountAfterProbe is an inotify open count n after a probe for the
// file's writers, made because a close left the count at n (inotify
// merges two like events in a row, so n may be off either way): keep
// false lets the count go (the file is no candidate); settled says no
// probe is needed until a writer's close (IN_CLOSE_WRITE). A writer found
// keeps the file at a count of at least 1; none found lets it go, however
// many readers the count says; an unknown outcome keeps a count above 0
// as it is and lets 0 go.
func OpenCountAfterProbe(n int32, w Writers) (keep bool, count int32, settled bool) {
	switch {
	case w == WritersSome:
		return true, max(n, 1), true
	case w == WritersNone, n <= 0:
		return false, 0, false
	}
	return true, n, true
}
