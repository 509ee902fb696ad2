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
// (FAN_OPEN, IN_OPEN) and/or a close (FAN_CLOSE_WRITE, FAN_CLOSE_NOWRITE):
// one more for an open, one fewer for a close, unchanged for an event
// that carries both (the kernel merged an open and a close of one process
// into it), never below 0 (a close of an open made before the watch).
func Opens(n int, open, closed bool) int {
	switch {
	case open && !closed:
		return n + 1
	case closed && !open:
		return max(n-1, 0)
	}
	return n
}
