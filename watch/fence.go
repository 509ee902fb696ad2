package watch

import (
	"context"
	"runtime"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// queueCursor counts the bytes a reader took from a notification queue
// (fanotify's or inotify's), so that Fence can tell when every event
// queued at its call has been read: the queue is FIFO, and FIONREAD says
// how many bytes wait in it.
type queueCursor struct {
	reading atomic.Bool   // a read(2) of the queue is under way
	read    atomic.Uint64 // bytes read from the queue so far
}

// readQueue is one non-blocking read(2) of the queue fd into buf, counted.
func (c *queueCursor) readQueue(fd int, buf []byte) (int, error) {
	c.reading.Store(true)
	n, err := unix.Read(fd, buf)
	if n > 0 {
		c.read.Add(uint64(n))
	}
	c.reading.Store(false)
	return n, err
}

// target returns the count of bytes read by which every byte queued now
// (queued: FIONREAD) has been read. A read under way, or one that ended
// between the two looks, makes it look again: the bytes a read took out
// of the queue are then either still in FIONREAD or already in read.
func (c *queueCursor) target(ctx context.Context, queued func() (int, error)) (uint64, error) {
	for {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if c.reading.Load() {
			runtime.Gosched()
			continue
		}
		r := c.read.Load()
		q, err := queued()
		if err != nil {
			return 0, err
		}
		if !c.reading.Load() && c.read.Load() == r {
			return r + uint64(q), nil
		}
	}
}

// fencePoll is how often Fence looks whether the events it waits for
// have been handled.
const fencePoll = time.Millisecond

// waitUntil returns nil once done reports true, or ctx's error.
func waitUntil(ctx context.Context, done func() bool) error {
	for !done() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(fencePoll):
		}
	}
	return nil
}
