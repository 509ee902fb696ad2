package service

import (
	"os"
	"slices"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestServeSignals: each SIGHUP reloads; a reload cut short by a shortage
// is retried after min_pause, doubling to max_pause (read after each
// reload), until one completes, with one warning when the retries start
// and one line when they end; a SIGHUP during the backoff reloads at once
// and the backoff goes on; SIGTERM is returned without a reload.
func TestServeSignals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		// Each reload's outcome in turn: short (true) or done.
		outcomes := []bool{false, true, true, true, true, true, false, true, true, true, false}
		var at []time.Duration
		lo, hi := 100*time.Millisecond, time.Second
		reload := func() bool {
			at = append(at, time.Since(start))
			short := outcomes[len(at)-1]
			if len(at) == 3 {
				hi = 800 * time.Millisecond // the reload changed max_pause
			}
			return short
		}
		core, logs := observer.New(zap.InfoLevel)
		sigs := make(chan os.Signal, 1)
		got := make(chan os.Signal, 1)
		go func() {
			got <- ServeSignals(SystemClock, sigs, reload, func() (time.Duration, time.Duration) { return lo, hi }, zap.New(core))
		}()
		sigs <- syscall.SIGHUP // done at once
		time.Sleep(time.Second)
		sigs <- syscall.SIGHUP // short: 1 s, then 1.1, 1.3, 1.7, 2.5 (max now 800ms), 3.3 done
		time.Sleep(4 * time.Second)
		sigs <- syscall.SIGHUP // 5 s: short; 5.1 short (next at 5.3)
		time.Sleep(150 * time.Millisecond)
		sigs <- syscall.SIGHUP // 5.15: short, the pause doubles: 5.55 done
		time.Sleep(time.Second)
		synctest.Wait()
		ms := func(v ...int) []time.Duration {
			var d []time.Duration
			for _, x := range v {
				d = append(d, time.Duration(x)*time.Millisecond)
			}
			return d
		}
		if want := ms(0, 1000, 1100, 1300, 1700, 2500, 3300, 5000, 5100, 5150, 5550); !slices.Equal(at, want) {
			t.Errorf("reloads at %v, want %v", at, want)
		}
		if n := logs.FilterMessageSnippet("retrying with backoff").FilterField(zap.Stringer("first_retry", lo)).Len(); n != 2 {
			t.Errorf("%d warnings that retries begin, want 2 (one per shortage): %v", n, logs.All())
		}
		if n := logs.FilterMessageSnippet("retried after the resource shortage completed").Len(); n != 2 {
			t.Errorf("%d lines that the retried reload completed, want 2: %v", n, logs.All())
		}
		sigs <- syscall.SIGTERM
		if sig := <-got; sig != syscall.SIGTERM {
			t.Errorf("returned %v, want SIGTERM", sig)
		}
		if len(at) != 11 {
			t.Errorf("SIGTERM reloaded")
		}
	})
}

// TestServeSignalsClosed: a closed signal channel is a stop (SIGTERM);
// SIGINT is returned as it is.
func TestServeSignalsClosed(t *testing.T) {
	never := func() bool { t.Error("reloaded"); return false }
	pauses := func() (time.Duration, time.Duration) { return time.Second, time.Second }
	sigs := make(chan os.Signal)
	close(sigs)
	if sig := ServeSignals(SystemClock, sigs, never, pauses, zap.NewNop()); sig != syscall.SIGTERM {
		t.Errorf("closed: %v, want SIGTERM", sig)
	}
	sigs = make(chan os.Signal, 1)
	sigs <- syscall.SIGINT
	if sig := ServeSignals(SystemClock, sigs, never, pauses, zap.NewNop()); sig != syscall.SIGINT {
		t.Errorf("SIGINT: %v", sig)
	}
}

// TestServeSignalsQueued: SIGHUPs queued together make one reload, and
// none is made when a SIGTERM is queued behind them (sent during
// start-up, before Serve reads).
func TestServeSignalsQueued(t *testing.T) {
	pauses := func() (time.Duration, time.Duration) { return time.Second, time.Second }
	for _, c := range []struct {
		name    string
		queued  []os.Signal
		reloads int
		want    os.Signal
	}{
		{"hup then term", []os.Signal{syscall.SIGHUP, syscall.SIGTERM}, 0, syscall.SIGTERM},
		{"hups then int", []os.Signal{syscall.SIGHUP, syscall.SIGHUP, syscall.SIGINT}, 0, syscall.SIGINT},
		{"hups", []os.Signal{syscall.SIGHUP, syscall.SIGHUP, syscall.SIGHUP}, 1, syscall.SIGTERM},
	} {
		t.Run(c.name, func(t *testing.T) {
			sigs := make(chan os.Signal, len(c.queued))
			for _, s := range c.queued {
				sigs <- s
			}
			reloads := 0
			reload := func() bool {
				reloads++
				if reloads == 1 && c.reloads == 1 {
					close(sigs) // ends Serve after this reload (SIGTERM)
				}
				return false
			}
			if c.reloads == 0 {
				close(sigs)
			}
			if got := ServeSignals(SystemClock, sigs, reload, pauses, zap.NewNop()); got != c.want {
				t.Errorf("returned %v, want %v", got, c.want)
			}
			if reloads != c.reloads {
				t.Errorf("%d reloads, want %d", reloads, c.reloads)
			}
		})
	}
}
