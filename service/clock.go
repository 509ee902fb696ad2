package service

import (
	"time"

	"golang.org/x/sys/unix"
)

// Clock is the time source of the lifecycle's timers. SystemClock is the
// real one; inside a testing/synctest bubble its timers run in virtual
// time. MonotonicUsec is the one reading synctest cannot fake.
type Clock interface {
	// Tick sends the time every d until stop is called (time.NewTicker).
	Tick(d time.Duration) (c <-chan time.Time, stop func())
	// After sends the time once, after d (time.After).
	After(d time.Duration) <-chan time.Time
	// MonotonicUsec is CLOCK_MONOTONIC in microseconds, as systemd wants
	// it in MONOTONIC_USEC= (sd_notify(3)).
	MonotonicUsec() int64
}

// SystemClock is the time package and CLOCK_MONOTONIC.
var SystemClock Clock = systemClock{}

type systemClock struct{}

func (systemClock) Tick(d time.Duration) (<-chan time.Time, func()) {
	t := time.NewTicker(d)
	return t.C, t.Stop
}

func (systemClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

func (systemClock) MonotonicUsec() int64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano() / 1000
}
