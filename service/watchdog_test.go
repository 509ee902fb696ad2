package service

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"flusherd/bdi"
	"flusherd/inode"
	"flusherd/tree"
)

// TestWatchdog: WATCHDOG=1 every interval/2 while every device is healthy;
// stuck calls change STATUS= (once, not every ping) but not the pings; a
// wedged device stops them, says so once in STATUS= and the log, and the
// pings resume, with STATUS=running, when it recovers; ctx ends the loop.
func TestWatchdog(t *testing.T) {
	sd := newFakeSystemd(t)
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		devs := []Health{{Name: "8:0", Healthy: true}, {Name: "8:16", Healthy: true}}
		set := func(i int, healthy bool, stuck int) {
			mu.Lock()
			defer mu.Unlock()
			devs[i].Healthy, devs[i].Stuck = healthy, stuck
		}
		health := func() []Health { mu.Lock(); defer mu.Unlock(); return slices.Clone(devs) }
		core, logs := observer.New(zap.InfoLevel)
		ctx, cancel := context.WithCancel(context.Background())
		returned := make(chan struct{})
		go func() {
			defer close(returned)
			Watchdog(ctx, 10*time.Second, health, NewNotifier(zap.NewNop(), SystemClock), zap.New(core))
		}()
		step := func(d time.Duration) { time.Sleep(d); synctest.Wait() }
		step(11 * time.Second) // ticks at 5 and 10 s
		sd.expect(t, "healthy", "WATCHDOG=1", "WATCHDOG=1")
		set(0, true, 2)
		step(10 * time.Second)
		sd.expect(t, "stuck calls", "STATUS=bdi 8:0: 2 writeback calls stuck past attempt_timeout (frozen or hung filesystem?); ", "WATCHDOG=1", "WATCHDOG=1")
		set(1, false, 0)
		step(10 * time.Second)
		sd.expect(t, "wedged", "STATUS=writeback goroutine of bdi 8:16 is wedged")
		if n := logs.FilterMessageSnippet("shows no sign of life").FilterField(zap.String("bdi", "8:16")).Len(); n != 1 {
			t.Errorf("%d log lines about the wedged device, want 1: %v", n, logs.All())
		}
		set(1, true, 0)
		set(0, true, 0)
		step(5 * time.Second)
		sd.expect(t, "recovered", "STATUS=running", "WATCHDOG=1")
		cancel()
		synctest.Wait()
		select {
		case <-returned:
		default:
			t.Fatal("Watchdog runs on after ctx ended")
		}
		step(10 * time.Second)
		sd.expect(t, "after ctx ended")
	})
}

// TestWatchdogRound: the first unhealthy device is named; every device
// with stuck calls is in the status.
func TestWatchdogRound(t *testing.T) {
	sick, status := watchdogRound([]Health{{Name: "a", Healthy: true, Stuck: 1}, {Name: "b"}, {Name: "c", Stuck: 3}})
	want := "bdi a: 1 writeback calls stuck past attempt_timeout (frozen or hung filesystem?); bdi c: 3 writeback calls stuck past attempt_timeout (frozen or hung filesystem?); "
	if sick != "b" || status != want {
		t.Errorf("watchdogRound = %q, %q; want b, %q", sick, status, want)
	}
	if sick, status := watchdogRound([]Health{{Name: "a", Healthy: true}}); sick != "" || status != "" {
		t.Errorf("healthy: %q, %q", sick, status)
	}
}

// TestRegistryHealthWedged: on a real registry, a device whose writeback
// goroutine is blocked (the BeforePass test hook) is reported unhealthy
// once the limit has passed, and healthy again when it runs; Liveness
// (/healthz) says the same.
func TestRegistryHealthWedged(t *testing.T) {
	var wedged atomic.Bool
	release := make(chan struct{})
	reg := bdi.NewRegistry(bdi.Options{
		Config:  bdi.Config{DirtyWritebackInterval: 50 * time.Millisecond, MinPause: time.Millisecond, MaxPause: 50 * time.Millisecond, WriteChunk: 4 << 20, PlugEnabled: true, MaxPending: 16, QueueDepth: 2},
		Resolve: func(dev uint64, path string) (string, error) { return "test", nil },
		BeforePass: func() {
			if wedged.Load() {
				<-release
			}
		},
	})
	defer func() { close(release); reg.Stop() }()
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	key, _, _ := inode.Stat(p)
	if _, err := reg.Device(key.Dev, p); err != nil {
		t.Fatal(err)
	}
	const limit = 200 * time.Millisecond
	health := RegistryHealth(reg, limit)
	live := Liveness(health, limit)
	healthy := func() bool {
		h := health()
		return len(h) == 1 && h[0].Name == "test" && h[0].Healthy && live() == nil
	}
	poll := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !ok(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s: %+v", what, health())
			}
		}
	}
	poll("a healthy device", healthy)
	wedged.Store(true)
	reg.MarkInodeDirty(p, key, "", tree.Tree{Expire: 0})
	poll("the wedged device reported", func() bool { h := health(); return len(h) == 1 && !h[0].Healthy })
	if err := live(); err == nil || !strings.Contains(err.Error(), "bdi test: writeback goroutine wedged") {
		t.Errorf("Liveness of the wedged device = %v, want it named", err)
	}
	wedged.Store(false)
	release <- struct{}{}
	poll("the device healthy again", healthy)
}

// TestStartWatchdog: with $WATCHDOG_USEC the pings start, at half its
// interval, with a warning when it is under twice attempt_timeout; an
// unusable value is a warning and no pings; without it, nothing.
// (attempt_timeout is 1.5 s here.)
func TestStartWatchdog(t *testing.T) {
	sd := newFakeSystemd(t)
	for _, tc := range []struct {
		usec    string
		pings   int // in 5 s
		warning string
	}{
		{"2000000", 5, "WatchdogSec is less than twice writeback.attempt_timeout"},
		{"20000000", 0, ""},
		{"2s", 0, "WATCHDOG_USEC is set but unusable"},
		{"", 0, ""},
	} {
		t.Setenv("WATCHDOG_USEC", tc.usec)
		synctest.Test(t, func(t *testing.T) {
			// Made in the bubble: its pause watch (Resumed) runs there.
			reg := bdi.NewRegistry(bdi.Options{Resolve: func(uint64, string) (string, error) { return "test", nil }})
			defer reg.Stop()
			core, logs := observer.New(zap.InfoLevel)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			StartWatchdog(ctx, reg, 1500*time.Millisecond, NewNotifier(zap.NewNop(), SystemClock), zap.New(core))
			time.Sleep(5*time.Second + time.Millisecond)
			synctest.Wait()
			var want []string
			for range tc.pings {
				want = append(want, "WATCHDOG=1")
			}
			sd.expect(t, "WATCHDOG_USEC="+tc.usec, want...)
			if n := logs.FilterLevelExact(zap.WarnLevel).Len(); (tc.warning == "") != (n == 0) || (n > 0 && logs.FilterMessageSnippet(tc.warning).Len() != 1) {
				t.Errorf("WATCHDOG_USEC=%s: warnings %v, want %q", tc.usec, logs.FilterLevelExact(zap.WarnLevel).All(), tc.warning)
			}
		})
	}
}

// TestHealthLimit: /healthz judges with the watchdog's interval under
// systemd, else with three times attempt_timeout.
func TestHealthLimit(t *testing.T) {
	t.Setenv("WATCHDOG_PID", "")
	t.Setenv("WATCHDOG_USEC", "")
	if got := HealthLimit(10 * time.Second); got != 30*time.Second {
		t.Errorf("without $WATCHDOG_USEC: %v, want 30s", got)
	}
	t.Setenv("WATCHDOG_USEC", "45000000")
	if got := HealthLimit(10 * time.Second); got != 45*time.Second {
		t.Errorf("with WATCHDOG_USEC=45000000: %v, want 45s", got)
	}
}

// TestLiveness: the first unhealthy device is named; stuck calls alone
// keep a device live, as they keep the watchdog pinging.
func TestLiveness(t *testing.T) {
	for _, c := range []struct {
		hs   []Health
		want string
	}{
		{nil, ""},
		{[]Health{{Name: "8:0", Healthy: true, Stuck: 2}}, ""},
		{[]Health{{Name: "8:0", Healthy: true}, {Name: "8:16"}, {Name: "7:0"}}, "bdi 8:16: writeback goroutine wedged (no sign of life within 30s)"},
	} {
		err := Liveness(func() []Health { return c.hs }, 30*time.Second)()
		if got := fmt.Sprint(err); c.want == "" && err != nil || c.want != "" && got != c.want {
			t.Errorf("Liveness(%+v) = %v, want %q", c.hs, err, c.want)
		}
	}
}
