package service

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// fakeSystemd is a unixgram socket standing in for systemd's notify
// socket ($NOTIFY_SOCKET): go-systemd's SdNotify sends to it for real.
// It is read without blocking (take), so that a synctest bubble sees
// every message sent before synctest.Wait; the kernel queues at most
// net.unix.max_dgram_qlen (10) datagrams, so take often.
type fakeSystemd struct{ fd int }

// newFakeSystemd makes the socket and points $NOTIFY_SOCKET at it; call
// it outside the bubble.
func newFakeSystemd(t *testing.T) *fakeSystemd {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify")
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	t.Setenv("NOTIFY_SOCKET", path)
	return &fakeSystemd{fd: fd}
}

// take returns the messages received since the last take, in order.
func (f *fakeSystemd) take(t *testing.T) []string {
	t.Helper()
	var msgs []string
	buf := make([]byte, 4096)
	for {
		n, _, err := unix.Recvfrom(f.fd, buf, unix.MSG_DONTWAIT)
		if errors.Is(err, unix.EAGAIN) {
			return msgs
		}
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, string(buf[:n]))
	}
}

// expect takes the messages and compares them with want.
func (f *fakeSystemd) expect(t *testing.T, when string, want ...string) {
	t.Helper()
	if got := f.take(t); !slices.Equal(got, want) {
		t.Errorf("%s: sent %q, want %q", when, got, want)
	}
}

// TestExtendWhile: EXTEND_TIMEOUT_USEC with STATUS= goes out on the first
// tick, then on a tick only when progress moved since the last one: a
// start-up stuck on one step sends none, so TimeoutStartSec still ends
// it; nothing after stop (idempotent).
func TestExtendWhile(t *testing.T) {
	sd := newFakeSystemd(t)
	synctest.Test(t, func(t *testing.T) {
		n := NewNotifier(zap.NewNop(), SystemClock)
		var p atomic.Int64
		stop := n.ExtendWhile(2*time.Second, 6*time.Second, func() string { return fmt.Sprint("starting: ", p.Load()) }, p.Load)
		ext := func(s string) string { return "EXTEND_TIMEOUT_USEC=6000000\nSTATUS=starting: " + s }
		time.Sleep(time.Second) // between ticks from here on
		synctest.Wait()
		sd.expect(t, "before the first tick")
		time.Sleep(2 * time.Second)
		synctest.Wait()
		sd.expect(t, "first tick, no progress yet", ext("0"))
		time.Sleep(6 * time.Second)
		synctest.Wait()
		sd.expect(t, "three ticks without progress")
		for i := range 3 {
			p.Add(1)
			time.Sleep(2 * time.Second)
			synctest.Wait()
			sd.expect(t, fmt.Sprint("tick after step ", i+1), ext(fmt.Sprint(i+1)))
		}
		p.Add(2) // two steps between ticks: one extension
		time.Sleep(4 * time.Second)
		synctest.Wait()
		sd.expect(t, "two ticks after two steps", ext("5"))
		stop()
		stop()
		p.Add(1)
		time.Sleep(10 * time.Second)
		synctest.Wait()
		sd.expect(t, "after stop")
	})
}

// TestStartProgress: the extensions' STATUS= counts the trees set up,
// then the trees offered to the watcher, and each step is progress.
func TestStartProgress(t *testing.T) {
	sd := newFakeSystemd(t)
	synctest.Test(t, func(t *testing.T) {
		s := StartProgress(NewNotifier(zap.NewNop(), SystemClock), 3)
		defer s.Stop()
		const ext = "EXTEND_TIMEOUT_USEC=6000000\nSTATUS="
		time.Sleep(StartupEvery + time.Second)
		synctest.Wait()
		sd.expect(t, "first tick", ext+"starting: 0 of 3 trees set up")
		for range 3 {
			s.SetUp()
		}
		time.Sleep(StartupEvery)
		synctest.Wait()
		sd.expect(t, "trees set up", ext+"starting: 3 of 3 trees set up")
		s.Offered()
		time.Sleep(StartupEvery)
		synctest.Wait()
		sd.expect(t, "a tree offered", ext+"starting: 3 of 3 trees set up, 1 of 3 offered to the watcher")
		time.Sleep(2 * StartupEvery)
		synctest.Wait()
		sd.expect(t, "no step")
	})
	if got := (&Startup{trees: 1}).Status(); got != "starting: 0 of 1 tree set up" {
		t.Errorf("one tree: %q", got)
	}
}

// TestProgress: STATUS= every interval until done is closed, then none.
func TestProgress(t *testing.T) {
	sd := newFakeSystemd(t)
	synctest.Test(t, func(t *testing.T) {
		n := NewNotifier(zap.NewNop(), SystemClock)
		done := make(chan struct{})
		var k atomic.Int64
		returned := make(chan struct{})
		go func() {
			defer close(returned)
			n.Progress(done, 2*time.Second, func() string { return fmt.Sprint("STATUS=scanned ", k.Add(1)) })
		}()
		time.Sleep(5 * time.Second)
		synctest.Wait()
		sd.expect(t, "5 s", "STATUS=scanned 1", "STATUS=scanned 2")
		close(done)
		synctest.Wait()
		select {
		case <-returned:
		default:
			t.Fatal("Progress runs on after done")
		}
		time.Sleep(5 * time.Second)
		synctest.Wait()
		sd.expect(t, "after done")
	})
}

// TestMonotonicUsec: the system clock's MONOTONIC_USEC is CLOCK_MONOTONIC
// in microseconds.
func TestMonotonicUsec(t *testing.T) {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	got := SystemClock.MonotonicUsec()
	if d := got - ts.Nano()/1000; d < 0 || d > 10e6 {
		t.Errorf("MonotonicUsec %d, CLOCK_MONOTONIC %d µs", got, ts.Nano()/1000)
	}
}
