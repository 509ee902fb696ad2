package testfs

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
)

// New is Mount for programs that are not tests (the bench): the same
// filesystem, made the same way, in a temporary directory of its own. A
// failure (Mount's Fatalf, or a Missing tool) is its error, with nothing
// left behind. Close the FS to undo what New did.
func New(opt Options) (fs *FS, err error) {
	r := &runner{}
	defer func() {
		if p := recover(); p != nil {
			if _, ok := p.(stop); !ok {
				panic(p)
			}
			r.mu.Lock()
			failed := r.err
			r.mu.Unlock()
			err = errors.Join(failed, r.close())
		}
	}()
	fs = Mount(r, opt)
	fs.r = r
	return fs, nil
}

// Close undoes what New did: unmount, detach, remove the image and the
// temporary directory; what failed is its error. An FS from Mount is torn
// down by the test's cleanup instead; Close does nothing for it.
func (f *FS) Close() error {
	if f.r == nil {
		return nil
	}
	return f.r.close()
}

// stop is the panic with which a runner ends Mount at Fatalf or Skipf.
type stop struct{}

// runner is T for New: Fatalf and Skipf end Mount (panic(stop{}), which
// New recovers) with that error; Errorf records one; cleanups run, last
// first, at close.
type runner struct {
	mu       sync.Mutex
	err      error
	cleanups []func()
}

func (r *runner) Helper() {}

func (r *runner) fail(format string, args ...any) {
	r.mu.Lock()
	r.err = errors.Join(r.err, fmt.Errorf(format, args...))
	r.mu.Unlock()
}

func (r *runner) Fatalf(format string, args ...any) { r.fail(format, args...); panic(stop{}) }
func (r *runner) Skipf(format string, args ...any)  { r.fail(format, args...); panic(stop{}) }
func (r *runner) Errorf(format string, args ...any) { r.fail(format, args...) }
func (r *runner) Logf(format string, args ...any)   {}

func (r *runner) Cleanup(f func()) {
	r.mu.Lock()
	r.cleanups = append(r.cleanups, f)
	r.mu.Unlock()
}

func (r *runner) TempDir() string {
	d, err := os.MkdirTemp("", "flusherd-testfs-")
	if err != nil {
		r.Fatalf("testfs: %v", err)
	}
	r.Cleanup(func() {
		if err := os.RemoveAll(d); err != nil {
			r.Errorf("testfs: %v", err)
		}
	})
	return d
}

// close runs the cleanups, last first, once, and returns the errors they
// (and nothing before them) recorded.
func (r *runner) close() error {
	r.mu.Lock()
	cs := r.cleanups
	r.cleanups = nil
	r.err = nil
	r.mu.Unlock()
	for _, f := range slices.Backward(cs) {
		f()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}
