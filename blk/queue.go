package blk

import (
	"slices"
	"sync"
	"time"
)

// Hooks is what a Queue's submitter supplies: the system call of a request
// and what to do as each call ends. Methods named ...Locked run with the
// Queue's Lock held and must not block; the func they return, if any, runs
// once it is released.
type Hooks[O comparable] interface {
	// Start is called on Run's goroutine before r's worker starts: take
	// what the call uses (a reference on its file).
	Start(r *Request[O])
	// Do makes r's system call, on r's worker, and returns its error.
	Do(r *Request[O]) error
	// Finished is called on r's worker when it is done with r: after
	// r's result was handed to Run, or after ReturnedLocked's func. Drop
	// what Start took.
	Finished(r *Request[O])
	// Alive is called on Run's goroutine each time a call ends, is
	// detached or times out: Run's goroutine is not wedged.
	Alive()
	// DetachedLocked: r's call has run for DetachAfter and Run stops
	// waiting for it (r.State() is Detached); began is when it started.
	DetachedLocked(r *Request[O], began time.Time)
	// TimedOutLocked: r's call has run for Timeout and Run stops waiting
	// for it (r.State() is TimedOut). It sets r.Err.
	TimedOutLocked(r *Request[O]) (after func())
	// ReturnedLocked: a detached or timed-out call (r.State() says
	// which) returned, with err.
	ReturnedLocked(r *Request[O], err error) (after func())
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
	// Lock is the submitter's lock, held around each request's change of
	// State and the Hooks' ...Locked methods.
	Lock  sync.Locker
	Hooks Hooks[O]
}

type result[O comparable] struct {
	r   *Request[O]
	err error
}

// Run runs the requests' calls on at most Depth workers at a time, and
// returns when each has returned (State Done, Err its error), has timed out
// (TimedOut) or, with detach, has been detached (Detached, Err nil: its
// data is on its way, as with any sync_file_range). Requests must be
// Running.
//
// A worker is a goroutine that runs one call after another (its stack,
// grown by the first, serves the rest); one whose call is detached or
// times out is replaced by a new one and ends when that call returns.
func (q *Queue[O]) Run(reqs []*Request[O], detach bool) {
	if len(reqs) == 0 {
		return
	}
	depth := max(1, q.Depth)
	results := make(chan result[O], len(reqs))
	work := make(chan *Request[O])
	defer close(work)
	live := 0 // workers not held by a detached or timed-out call
	type running struct {
		r        *Request[O]
		began    time.Time
		deadline time.Time // zero: no timeout
		detachAt time.Time // zero: waited for
	}
	var inflight []running
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	next, finished := 0, 0
	for finished < len(reqs) {
		for len(inflight) < depth && next < len(reqs) {
			r := reqs[next]
			next++
			q.Hooks.Start(r)
			x := running{r: r, began: time.Now()}
			if q.Timeout > 0 {
				x.deadline = x.began.Add(q.Timeout)
			}
			if detach && !r.Integrity {
				x.detachAt = x.began.Add(q.DetachAfter)
			}
			inflight = append(inflight, x)
			if live < depth {
				live++
				go q.worker(work, results)
			}
			work <- r
		}
		var earliest time.Time
		for _, x := range inflight {
			for _, t := range []time.Time{x.deadline, x.detachAt} {
				if !t.IsZero() && (earliest.IsZero() || t.Before(earliest)) {
					earliest = t
				}
			}
		}
		var tc <-chan time.Time
		if !earliest.IsZero() {
			tc = ResetTimer(&timer, time.Until(earliest))
		}
		select {
		case res := <-results:
			q.Hooks.Alive()
			res.r.Err = res.err
			inflight = slices.DeleteFunc(inflight, func(x running) bool { return x.r == res.r })
			finished++
		case <-tc:
			q.Hooks.Alive()
			now := time.Now()
			keep := inflight[:0]
			for _, x := range inflight {
				detachNow := !x.detachAt.IsZero() && !now.Before(x.detachAt)
				timedOut := !x.deadline.IsZero() && !now.Before(x.deadline)
				if !detachNow && !timedOut {
					keep = append(keep, x)
					continue
				}
				q.Lock.Lock()
				switch {
				case detachNow && x.r.state.CompareAndSwap(int32(Running), int32(Detached)):
					q.Hooks.DetachedLocked(x.r, x.began)
					q.Lock.Unlock()
					finished++
					live-- // its worker ends when the call returns
					continue
				case timedOut && x.r.state.CompareAndSwap(int32(Running), int32(TimedOut)):
					after := q.Hooks.TimedOutLocked(x.r)
					q.Lock.Unlock()
					if after != nil {
						after()
					}
					finished++
					live--
					continue
				}
				q.Lock.Unlock()
				keep = append(keep, x) // its result is on the way
			}
			inflight = keep
		}
	}
}

// worker runs the calls of the requests Run hands it, until work is
// closed or one of its calls was detached or timed out (Run has started
// another worker in its place).
func (q *Queue[O]) worker(work <-chan *Request[O], results chan<- result[O]) {
	for r := range work {
		if !q.call(r, results) {
			return
		}
	}
}

// call runs one request's call on its worker and reports it (see Run). It
// returns false when Run had stopped waiting for the call (detached or
// timed out).
func (q *Queue[O]) call(r *Request[O], results chan<- result[O]) bool {
	err := q.Hooks.Do(r)
	q.Lock.Lock()
	if r.state.CompareAndSwap(int32(Running), int32(Done)) {
		q.Lock.Unlock()
		results <- result[O]{r, err}
		q.Hooks.Finished(r)
		return true
	}
	after := q.Hooks.ReturnedLocked(r, err)
	q.Lock.Unlock()
	if after != nil {
		after()
	}
	q.Hooks.Finished(r)
	return false
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
