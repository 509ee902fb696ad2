package blk

import (
	"sync"
	"sync/atomic"
	"time"
)

// Hooks is what a Queue's submitter supplies: the system call of a request
// and what to do as each call ends. A Queue holds no lock of the
// submitter's and none of its own while it calls them.
type Hooks[O comparable] interface {
	// Start is called on r's worker before its call: take what the call
	// uses (a reference on its file).
	Start(r *Request[O])
	// Do makes r's system call, on r's worker, and returns its error.
	Do(r *Request[O]) error
	// Finished is called on r's worker when it is done with r: after
	// r's result was handed to Run, or after Returned. Drop what Start
	// took.
	Finished(r *Request[O])
	// Alive says the goroutine that called Run is not wedged: it is
	// waiting on calls that make progress. It is called on a worker each
	// time a call ends in time, and on Run's goroutine each time it
	// wakes for a call that is due (detached or timed out); calls may be
	// concurrent.
	Alive()
	// Detached is called on Run's goroutine: r's call has run for
	// DetachAfter and Run stops waiting for it (r.State() is Detached);
	// began is when it started.
	Detached(r *Request[O], began time.Time)
	// TimedOut is called on Run's goroutine: r's call has run for Timeout
	// and Run stops waiting for it (r.State() is TimedOut). It sets r.Err.
	TimedOut(r *Request[O])
	// Returned is called on r's worker when a detached or timed-out call
	// (r.State() says which) returns, with err; always after Detached or
	// TimedOut has returned.
	Returned(r *Request[O], err error)
}

// Queue runs requests' system calls on workers, as a block device's
// request queue runs bios: at most Depth at a time, each bounded by
// Timeout, and, when asked, left to finish on its worker after
// DetachAfter. A Queue is a value made for one Run, or reused by one
// goroutine at a time.
type Queue[O comparable] struct {
	// Depth is the most calls in flight (queue_depth; at least 1).
	Depth int
	// Timeout bounds each call (attempt_timeout); 0: none. A call that
	// runs longer cannot be cancelled: it is given up on (TimedOut) and
	// goes on on its worker.
	Timeout time.Duration
	// DetachAfter is how long Run waits on a call that is not Integrity
	// before it detaches it, when Run is asked to detach.
	DetachAfter time.Duration
	Hooks       Hooks[O]
	// Idle, if set, is called on Run's goroutine while calls run, again
	// and again until it returns false: work of the submitter's own (the
	// completion of an earlier batch) done in the time Run would wait.
	// Each call must be short: due calls are looked at between them.
	Idle func() bool
}

// Run runs the requests' calls on at most Depth workers at a time, and
// returns when each has returned (State Done, Err its error), has timed out
// (TimedOut) or, with detach, has been detached (Detached, Err nil: its
// data is on its way, as with any sync_file_range). Requests must be
// Running.
//
// A worker is a goroutine that takes one request after another, in order,
// and runs its call (its stack, grown by the first, serves the rest); a
// call's end costs no wakeup of Run's goroutine, which sleeps until the
// last has ended or the earliest running call is due to be detached or
// given up on. A worker whose call is detached or times out is replaced
// (while requests are left) and ends when that call returns.
func (q *Queue[O]) Run(reqs []*Request[O], detach bool) {
	if len(reqs) == 0 {
		return
	}
	r := &run[O]{q: q, reqs: reqs, detach: detach, done: make(chan struct{})}
	for range min(max(1, q.Depth), len(reqs)) {
		r.spawn()
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	idle := q.Idle
	for {
		for idle != nil {
			if !idle() {
				idle = nil
			}
			select {
			case <-r.done:
				return
			default:
			}
		}
		earliest := r.earliest()
		var tc <-chan time.Time
		if !earliest.IsZero() {
			tc = ResetTimer(&timer, time.Until(earliest))
		}
		select {
		case <-r.done:
			return
		case <-tc:
			q.Hooks.Alive()
			r.overdue(time.Now())
		}
	}
}

// run is one Run's state.
type run[O comparable] struct {
	q      *Queue[O]
	reqs   []*Request[O]
	detach bool
	done   chan struct{} // closed when every request has finished
	// finished counts the requests Done, Detached or TimedOut.
	finished atomic.Int32
	// slots are the workers' current calls, and next the index in reqs
	// of the next request to take. Guarded by mu, which only the
	// workers (at each call's start and end) and Run's goroutine (when a
	// call is due) take.
	mu    sync.Mutex
	slots []*slot[O]
	next  int
}

// slot is a worker's current call: its request (nil between calls, and
// once detached or timed out), when the call began, and, once Run has
// found it due, a channel closed when Run's hook for it has returned.
type slot[O comparable] struct {
	r        *Request[O]
	began    time.Time
	reported chan struct{}
}

// spawn starts a worker.
func (r *run[O]) spawn() {
	s := &slot[O]{}
	r.mu.Lock()
	r.slots = append(r.slots, s)
	r.mu.Unlock()
	go r.worker(s)
}

// worker takes the requests in order and runs their calls until none is
// left or one of its calls was detached or timed out.
func (r *run[O]) worker(s *slot[O]) {
	q := r.q
	for {
		// The request is taken and shown in the slot at once, so that
		// Run never waits without a timer on a call it cannot see.
		r.mu.Lock()
		if r.next >= len(r.reqs) {
			r.mu.Unlock()
			return
		}
		req := r.reqs[r.next]
		r.next++
		s.r, s.began, s.reported = req, time.Now(), nil
		r.mu.Unlock()
		q.Hooks.Start(req)
		err := q.Hooks.Do(req)
		r.mu.Lock()
		reported := s.reported
		if s.r == req {
			s.r = nil
		}
		r.mu.Unlock()
		if req.state.CompareAndSwap(int32(Running), int32(Done)) {
			req.Err = err
			last := r.finished.Add(1) == int32(len(r.reqs))
			q.Hooks.Alive()
			q.Hooks.Finished(req)
			if last {
				close(r.done)
			}
			continue
		}
		// Run detached it or gave up on it: Returned follows its hook.
		<-reported
		q.Hooks.Returned(req, err)
		q.Hooks.Finished(req)
		return
	}
}

// deadlines returns when the call of req, begun at began, is to be
// detached and given up on (zero: never).
func (r *run[O]) deadlines(req *Request[O], began time.Time) (detachAt, deadline time.Time) {
	if r.q.Timeout > 0 {
		deadline = began.Add(r.q.Timeout)
	}
	if r.detach && !req.Integrity {
		detachAt = began.Add(r.q.DetachAfter)
	}
	return detachAt, deadline
}

// earliest returns the first time a running call is due (zero: none).
// A call that begins meanwhile is due no earlier than DetachAfter (or
// Timeout) from now, so Run also wakes then while requests are left to
// take.
func (r *run[O]) earliest() time.Time {
	var earliest time.Time
	r.mu.Lock()
	for _, s := range r.slots {
		if s.r != nil {
			d, t := r.deadlines(s.r, s.began)
			earliest = earlier(earlier(earliest, d), t)
		}
	}
	left := r.next < len(r.reqs)
	r.mu.Unlock()
	if left {
		d, t := r.deadlines(&Request[O]{}, time.Now())
		earliest = earlier(earlier(earliest, d), t)
	}
	return earliest
}

// earlier returns the earlier of a and b, a zero time being none.
func earlier(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// overdue detaches or gives up on the calls due by now, and replaces
// their workers while requests are left to take.
func (r *run[O]) overdue(now time.Time) {
	q := r.q
	r.mu.Lock()
	type due struct {
		s        *slot[O]
		req      *Request[O]
		began    time.Time
		detachIt bool
		reported chan struct{}
	}
	var dues []due
	for _, s := range r.slots {
		if s.r == nil {
			continue
		}
		detachAt, deadline := r.deadlines(s.r, s.began)
		detachNow := !detachAt.IsZero() && !now.Before(detachAt)
		timedOut := !deadline.IsZero() && !now.Before(deadline)
		if detachNow || timedOut {
			// Its worker, if its call returns now and finds it taken,
			// waits on reported for the hook below.
			s.reported = make(chan struct{})
			dues = append(dues, due{s, s.r, s.began, detachNow, s.reported})
		}
	}
	r.mu.Unlock()
	for _, d := range dues {
		switch {
		case d.detachIt && d.req.state.CompareAndSwap(int32(Running), int32(Detached)):
			q.Hooks.Detached(d.req, d.began)
		case !d.detachIt && d.req.state.CompareAndSwap(int32(Running), int32(TimedOut)):
			q.Hooks.TimedOut(d.req)
		default:
			close(d.reported)
			continue // it returned just now: its worker reports it
		}
		close(d.reported)
		last := r.finished.Add(1) == int32(len(r.reqs))
		r.mu.Lock()
		if d.s.r == d.req {
			d.s.r = nil // (its worker ends when the call returns)
		}
		left := r.next < len(r.reqs)
		r.mu.Unlock()
		if last {
			close(r.done)
		} else if left {
			r.spawn()
		}
	}
}

// ResetTimer arms *t to fire after d, making it on first use, and returns
// its channel. (Since Go 1.23 a Reset timer never delivers a stale value.)
func ResetTimer(t **time.Timer, d time.Duration) <-chan time.Time {
	if *t == nil {
		*t = time.NewTimer(d)
	} else {
		(*t).Reset(d)
	}
	return (*t).C
}

// Timed runs call on a goroutine of its own and waits for it for timeout at
// most (0: no bound). It returns call's results and true when it returned
// in time; else zero values and false, and late, if not nil, gets call's
// results when it returns (on that goroutine). A caller that must keep
// something alive for call takes it before and lets go of it in late, or
// at once when ok.
func Timed[T any](timeout time.Duration, call func() (T, error), late func(T, error)) (v T, err error, ok bool) {
	type res struct {
		v   T
		err error
	}
	var mu sync.Mutex
	gaveUp := false
	done := make(chan res, 1)
	go func() {
		v, err := call()
		mu.Lock()
		if !gaveUp {
			done <- res{v, err} // buffered: never blocks
			mu.Unlock()
			return
		}
		mu.Unlock()
		if late != nil {
			late(v, err)
		}
	}()
	var tc <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		tc = t.C
	}
	select {
	case r := <-done:
		return r.v, r.err, true
	case <-tc:
	}
	mu.Lock()
	select {
	case r := <-done: // returned just now
		mu.Unlock()
		return r.v, r.err, true
	default:
	}
	gaveUp = true
	mu.Unlock()
	var zero T
	return zero, nil, false
}
