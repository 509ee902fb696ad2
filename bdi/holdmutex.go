package bdi

import (
	"sync"
	"sync/atomic"
	"time"
)

// holdMutex is a sync.Mutex that records the longest time it was held, so
// that a blocking call made under the list lock shows (list_lock_max_us in
// the stats file). Two monotonic clock reads per Lock/Unlock pair; the zero value is
// an unlocked mutex.
type holdMutex struct {
	sync.Mutex
	since time.Duration // when it was last locked (monotonic, since holdEpoch); written by the holder only
	max   atomic.Int64  // the longest hold, in nanoseconds
}

// holdEpoch is the origin of holdMutex's clock: time.Since of it reads the
// monotonic clock only (one vDSO call), where time.Now reads the wall
// clock too.
var holdEpoch = time.Now()

// Lock locks m and notes when.
//
// +checklocksignore: a wrapper of sync.Mutex; callers' uses are checked.
func (m *holdMutex) Lock() {
	m.Mutex.Lock()
	m.since = time.Since(holdEpoch)
}

// Unlock records the hold if it is the longest yet and unlocks m.
//
// +checklocksignore: a wrapper of sync.Mutex; callers' uses are checked.
func (m *holdMutex) Unlock() {
	if d := int64(time.Since(holdEpoch) - m.since); d > m.max.Load() {
		m.max.Store(d) // only the holder writes: no lost update
	}
	m.Mutex.Unlock()
}

// MaxHold returns the longest time m was held so far.
func (m *holdMutex) MaxHold() time.Duration { return time.Duration(m.max.Load()) }
