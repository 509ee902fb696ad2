package blk

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// fakeHooks records what a Queue asks of its submitter. Each request's
// call blocks until its release channel is closed (or returns at once
// without one), then returns err[r.Ino]. A Detached or TimedOut hook
// takes hookDelay (the worker of a call that returns meanwhile must wait
// for it before Returned).
type fakeHooks struct {
	t                   *testing.T
	mu                  sync.Mutex
	release             map[uint64]chan struct{}
	err                 map[uint64]error
	hookDelay           time.Duration
	running, maxRunning int
	started, finished   map[uint64]int
	detached, timedOut  []uint64
	hooked              map[uint64]bool // Detached or TimedOut has returned
	returned            map[uint64]error
	alive               atomic.Int64
}

func newFakeHooks(t *testing.T) *fakeHooks {
	return &fakeHooks{t: t, release: map[uint64]chan struct{}{}, err: map[uint64]error{},
		started: map[uint64]int{}, finished: map[uint64]int{}, returned: map[uint64]error{}, hooked: map[uint64]bool{}}
}

func (h *fakeHooks) Start(r *Request[*int]) {
	h.mu.Lock()
	h.started[r.Ino]++
	h.mu.Unlock()
}

func (h *fakeHooks) Do(r *Request[*int]) error {
	h.mu.Lock()
	if h.started[r.Ino] != 1 {
		h.t.Errorf("request %d: Do before Start", r.Ino)
	}
	h.running++
	h.maxRunning = max(h.maxRunning, h.running)
	ch, err := h.release[r.Ino], h.err[r.Ino]
	h.mu.Unlock()
	if ch != nil {
		<-ch
	} else {
		time.Sleep(time.Millisecond)
	}
	h.mu.Lock()
	h.running--
	h.mu.Unlock()
	return err
}

func (h *fakeHooks) Finished(r *Request[*int]) {
	h.mu.Lock()
	h.finished[r.Ino]++
	h.mu.Unlock()
}

func (h *fakeHooks) Alive() { h.alive.Add(1) }

func (h *fakeHooks) Detached(r *Request[*int], began time.Time) {
	if r.State() != Detached {
		h.t.Errorf("request %d: Detached in state %d", r.Ino, r.State())
	}
	h.mu.Lock()
	h.detached = append(h.detached, r.Ino)
	h.mu.Unlock()
	time.Sleep(h.hookDelay)
	h.mu.Lock()
	h.hooked[r.Ino] = true
	h.mu.Unlock()
}

func (h *fakeHooks) TimedOut(r *Request[*int]) {
	if r.State() != TimedOut {
		h.t.Errorf("request %d: TimedOut in state %d", r.Ino, r.State())
	}
	r.Err = errTimeout
	h.mu.Lock()
	h.timedOut = append(h.timedOut, r.Ino)
	h.mu.Unlock()
	time.Sleep(h.hookDelay)
	h.mu.Lock()
	h.hooked[r.Ino] = true
	h.mu.Unlock()
}

func (h *fakeHooks) Returned(r *Request[*int], err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.hooked[r.Ino] {
		h.t.Errorf("request %d: Returned before its Detached or TimedOut hook returned", r.Ino)
	}
	if _, dup := h.returned[r.Ino]; dup {
		h.t.Errorf("request %d: Returned twice", r.Ino)
	}
	h.returned[r.Ino] = err
}

var errTimeout = errors.New("timed out")

// counts returns how often request ino was started and finished, and
// whether (and with what) its late return was reported.
func (h *fakeHooks) counts(ino uint64) (started, finished int, returned error, wasReturned bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	returned, wasReturned = h.returned[ino]
	return h.started[ino], h.finished[ino], returned, wasReturned
}

func reqs(n int, integrity bool) []*Request[*int] {
	out := make([]*Request[*int], n)
	for i := range out {
		out[i] = &Request[*int]{Ino: uint64(i), Integrity: integrity}
	}
	return out
}

// TestQueueRun: calls in time report their errors; at most Depth run at
// once; a call past Timeout is given up on and heard of when it returns;
// with detach, a call that is not integrity work is detached after
// DetachAfter, an integrity call is not; every Start has its Finished.
func TestQueueRun(t *testing.T) {
	t.Run("in time, bounded depth", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			h := newFakeHooks(t)
			eio := errors.New("EIO")
			h.err[3] = eio
			q := Queue[*int]{Depth: 2, Timeout: time.Second, DetachAfter: 100 * time.Millisecond, Hooks: h}
			rs := reqs(5, false)
			q.Run(rs, true)
			synctest.Wait()
			for _, r := range rs {
				want := error(nil)
				if r.Ino == 3 {
					want = eio
				}
				if r.State() != Done || r.Err != want {
					t.Errorf("request %d: state %d err %v, want done, %v", r.Ino, r.State(), r.Err, want)
				}
				if st, fin, _, _ := h.counts(r.Ino); st != 1 || fin != 1 {
					t.Errorf("request %d: started %d, finished %d times", r.Ino, st, fin)
				}
			}
			h.mu.Lock()
			maxRunning := h.maxRunning
			h.mu.Unlock()
			if maxRunning != 2 {
				t.Errorf("at most %d calls ran at once, want Depth 2", maxRunning)
			}
			if h.alive.Load() < 5 {
				t.Errorf("Alive called %d times for 5 calls", h.alive.Load())
			}
		})
	})
	t.Run("timeout", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			h := newFakeHooks(t)
			h.release[1] = make(chan struct{})
			h.err[1] = errors.New("late")
			q := Queue[*int]{Depth: 4, Timeout: time.Second, Hooks: h}
			rs := reqs(2, true)
			start := time.Now()
			q.Run(rs, true)
			if took := time.Since(start); took != time.Second {
				t.Errorf("Run returned after %v, want the 1s timeout", took)
			}
			if rs[1].State() != TimedOut || rs[1].Err != errTimeout || len(h.timedOut) != 1 {
				t.Errorf("blocked call: state %d err %v timed out %v", rs[1].State(), rs[1].Err, h.timedOut)
			}
			if rs[0].State() != Done {
				t.Errorf("the other call: state %d", rs[0].State())
			}
			if _, fin, _, ok := h.counts(1); ok || fin != 0 {
				t.Error("the blocked call was reported returned before it returned")
			}
			close(h.release[1])
			synctest.Wait()
			if _, fin, err, ok := h.counts(1); !ok || err == nil || fin != 1 {
				t.Errorf("after it returned: returned %v (%v), finished %d", err, ok, fin)
			}
		})
	})
	t.Run("detach", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			h := newFakeHooks(t)
			h.release[0] = make(chan struct{})
			h.release[1] = make(chan struct{})
			q := Queue[*int]{Depth: 4, Timeout: 10 * time.Second, DetachAfter: 100 * time.Millisecond, Hooks: h}
			bg := &Request[*int]{Ino: 0}
			integ := &Request[*int]{Ino: 1, Integrity: true}
			go func() { time.Sleep(3 * time.Second); close(h.release[1]) }()
			start := time.Now()
			q.Run([]*Request[*int]{bg, integ}, true)
			if took := time.Since(start); took != 3*time.Second {
				t.Errorf("Run returned after %v, want 3s (the integrity call is waited for)", took)
			}
			if bg.State() != Detached || bg.Err != nil || len(h.detached) != 1 {
				t.Errorf("background call: state %d err %v detached %v", bg.State(), bg.Err, h.detached)
			}
			if integ.State() != Done {
				t.Errorf("integrity call: state %d, want done", integ.State())
			}
			close(h.release[0])
			synctest.Wait()
			if _, fin, _, ok := h.counts(0); !ok || fin != 1 {
				t.Errorf("the detached call's return was not reported")
			}
			// Without detach, the same call is waited for.
			h2 := newFakeHooks(t)
			h2.release[0] = make(chan struct{})
			go func() { time.Sleep(2 * time.Second); close(h2.release[0]) }()
			r := &Request[*int]{Ino: 0}
			q2 := Queue[*int]{Depth: 1, DetachAfter: 100 * time.Millisecond, Hooks: h2}
			q2.Run([]*Request[*int]{r}, false)
			if r.State() != Done || len(h2.detached) != 0 {
				t.Errorf("detach false: state %d, detached %v", r.State(), h2.detached)
			}
		})
	})
}

// TestQueueReturnAtDue: a call that returns at the instant Run finds it
// due ends exactly one way: Done (no hook, no Returned), or Detached then
// Returned once its Detached hook has returned; Finished once either way.
func TestQueueReturnAtDue(t *testing.T) {
	ways := map[State]int{}
	for i := 0; i < 200; i++ {
		synctest.Test(t, func(t *testing.T) {
			h := newFakeHooks(t)
			h.hookDelay = 5 * time.Millisecond
			h.release[0] = make(chan struct{})
			go func() { time.Sleep(100 * time.Millisecond); close(h.release[0]) }()
			r := &Request[*int]{Ino: 0}
			q := Queue[*int]{Depth: 1, Timeout: time.Second, DetachAfter: 100 * time.Millisecond, Hooks: h}
			q.Run([]*Request[*int]{r}, true)
			synctest.Wait()
			_, fin, _, returned := h.counts(0)
			ways[r.State()]++
			switch st := r.State(); {
			case fin != 1:
				t.Errorf("state %d: finished %d times", st, fin)
			case st == Done && (returned || len(h.detached) != 0):
				t.Errorf("done in time, yet detached %v, returned %v", h.detached, returned)
			case st == Detached && (!returned || len(h.detached) != 1):
				t.Errorf("detached %v, returned %v; want one Detached, then Returned", h.detached, returned)
			case st != Done && st != Detached:
				t.Errorf("state %d", st)
			}
		})
	}
	t.Logf("ways a call returning at its detach time ended: %v", ways)
}

// TestTimed: a call in time gives its results; a late one gives zero
// values and false, and its results reach late once it returns; no
// timeout waits as long as the call takes.
func TestTimed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		v, err, ok := Timed(time.Second, func() (int, error) { time.Sleep(500 * time.Millisecond); return 7, nil }, nil)
		if v != 7 || err != nil || !ok {
			t.Errorf("in time: %d, %v, %v", v, err, ok)
		}
		lateV := make(chan int, 1)
		eio := errors.New("EIO")
		v, err, ok = Timed(time.Second, func() (int, error) { time.Sleep(3 * time.Second); return 9, eio },
			func(v int, err error) {
				if err != eio {
					t.Errorf("late err %v", err)
				}
				lateV <- v
			})
		if v != 0 || err != nil || ok {
			t.Errorf("late: %d, %v, %v; want 0, nil, false", v, err, ok)
		}
		select {
		case <-lateV:
			t.Error("late ran before the call returned")
		default:
		}
		time.Sleep(3 * time.Second)
		synctest.Wait()
		if got := <-lateV; got != 9 {
			t.Errorf("late got %d", got)
		}
		v, _, ok = Timed(0, func() (int, error) { time.Sleep(time.Hour); return 1, nil }, nil)
		if v != 1 || !ok {
			t.Errorf("no timeout: %d, %v", v, ok)
		}
	})
}
