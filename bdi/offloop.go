package bdi

import (
	"sync"
	"sync/atomic"
	"time"

	"flusherd/inode"
	"flusherd/lists"
)

// offLoop is a device's record of the calls that run off its goroutine
// (closes, detached writeback calls, background samples), so that they
// count in stuck_calls once past attempt_timeout, and its closer, which
// runs the closes. It owns its lock, a leaf that may be taken under the
// list lock.
type offLoop struct {
	now func() time.Duration // the daemon clock
	mu  sync.Mutex
	// since holds the running calls by id: when each began.
	// +checklocks:mu
	since map[uint64]time.Duration
	// +checklocks:mu
	seq uint64
	// +checklocks:mu
	closeQ lists.FIFO[queuedClose] // files waiting for the closer
	// +checklocks:mu
	closers int // closer goroutines running
	// +checklocks:mu
	closeBegan time.Duration // when the last close began
	// n is len(since), read without the lock (a pass checks it per inode).
	n atomic.Int64
}

// queuedClose is a file waiting for the closer, and its record's id.
type queuedClose struct {
	f    inode.File
	id   uint64
	note closeNote
}

// track records a call begun at since (daemon clock) and returns its id
// for returned.
func (o *offLoop) track(since time.Duration) uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.trackLocked(since)
}

// +checklocks:o.mu
func (o *offLoop) trackLocked(since time.Duration) uint64 {
	o.seq++
	if o.since == nil {
		o.since = map[uint64]time.Duration{}
	}
	o.since[o.seq] = since
	o.n.Add(1)
	return o.seq
}

// returned ends the record of call id, and says how long it ran and
// whether that was past timeout (0: no bound).
func (o *offLoop) returned(id uint64, timeout time.Duration) (took time.Duration, overran bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.returnedLocked(id, timeout)
}

// +checklocks:o.mu
func (o *offLoop) returnedLocked(id uint64, timeout time.Duration) (took time.Duration, overran bool) {
	began, ok := o.since[id]
	took = o.now() - began
	if ok {
		delete(o.since, id)
		o.n.Add(-1)
	}
	return took, timeout > 0 && took > timeout
}

// stuck counts the calls running for longer than timeout (0: none is).
func (o *offLoop) stuck(timeout time.Duration) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	if timeout <= 0 || len(o.since) == 0 {
		return 0
	}
	n, now := 0, o.now()
	for _, since := range o.since {
		if now-since > timeout {
			n++
		}
	}
	return n
}

// running counts the calls recorded, without taking the lock.
func (o *offLoop) running() int { return int(o.n.Load()) }

// queueClose queues f for the closer, with what to report of its close
// (closeNote), and says whether a closer goroutine is to be started
// (Writeback.closeFile): close(2) can block for long (a FUSE or NFS file's
// flush writes it back and waits; a stalled server holds it; the last
// close of a deleted file frees its blocks). Closes run one after
// another; another closer starts when the last close begun has run for
// detachAfter, so one stalled close holds up no more than that. Each is
// recorded from the time it is queued.
func (o *offLoop) queueClose(f inode.File, n closeNote) (start bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := o.now()
	id := o.trackLocked(now)
	o.closeQ.Push(queuedClose{f, id, n})
	start = o.closers == 0 || now-o.closeBegan > detachAfter
	if start {
		o.closers++
		o.closeBegan = now
	}
	return start
}

// nextClose takes the next queued close; ok false: none is left, and the
// calling closer ends.
func (o *offLoop) nextClose() (c queuedClose, ok bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	c, ok = o.closeQ.Pop()
	if !ok {
		o.closers--
		return queuedClose{}, false
	}
	o.closeBegan = o.now()
	return c, true
}

// closeFile closes f off the device's goroutine (offLoop.queueClose), and
// reports its outcome as n asks (closeReturned).
func (wb *Writeback) closeFile(f inode.File, n closeNote) {
	if wb.calls.queueClose(f, n) {
		go wb.closer()
	}
}

// closer runs the queued closes until none is left.
func (wb *Writeback) closer() {
	for {
		c, ok := wb.calls.nextClose()
		if !ok {
			return
		}
		err := c.f.Close()
		wb.calls.returned(c.id, 0)
		if c.note.report {
			wb.closeReturned(c.note, err)
		}
	}
}

// detachAfter is how long the device's goroutine waits on an attempt's
// call that is not integrity work before leaving it to finish on its
// worker. On a slow device a call queues behind the device's backlog (a
// full request queue, a loop device over slow storage) for as long as that
// backlog takes to drain; the goroutine does not wait on it: it completes
// the attempt as still dirty (retried once the call returns) and goes on
// to other inodes. Integrity calls are waited for: their result is the
// attempt's (a sync request's answer). (The kernel's writeback_sb_inodes
// ends a pass after a time slice of the same 100 ms.)
const detachAfter = 100 * time.Millisecond
