package main

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestPercentile(t *testing.T) {
	ms := func(n ...int) []time.Duration {
		var d []time.Duration
		for _, v := range n {
			d = append(d, time.Duration(v)*time.Millisecond)
		}
		return d
	}
	if got := percentile(nil, 50); got != 0 {
		t.Errorf("empty: %v", got)
	}
	// 1..100 ms, shuffled: nearest rank.
	var v []time.Duration
	for i := 100; i >= 1; i-- {
		v = append(v, time.Duration(i)*time.Millisecond)
	}
	for p, want := range map[float64]time.Duration{50: 50 * time.Millisecond, 99: 99 * time.Millisecond, 100: 100 * time.Millisecond, 1: time.Millisecond, 0: time.Millisecond} {
		if got := percentile(v, p); got != want {
			t.Errorf("p%v = %v, want %v", p, got, want)
		}
	}
	if v[0] != 100*time.Millisecond {
		t.Error("percentile sorted its argument")
	}
	// Small sets: p99 of 3 values is the largest; p50 the middle one.
	if got := percentile(ms(3, 1, 2), 99); got != 3*time.Millisecond {
		t.Errorf("p99 of 3 = %v", got)
	}
	if got := percentile(ms(3, 1, 2), 50); got != 2*time.Millisecond {
		t.Errorf("p50 of 3 = %v", got)
	}
	if got := percentile(ms(4, 1, 3, 2), 50); got != 2*time.Millisecond {
		t.Errorf("p50 of 4 = %v", got)
	}
}

func TestStalledTime(t *testing.T) {
	ds := []time.Duration{time.Millisecond, 100 * time.Millisecond, 101 * time.Millisecond, 20 * time.Second}
	if got, want := stalledTime(ds, stallOver), 20*time.Second+101*time.Millisecond; got != want {
		t.Errorf("stalled = %v, want %v (a call of exactly 100 ms is not a stall)", got, want)
	}
	if got := stalledTime(nil, stallOver); got != 0 {
		t.Errorf("none: %v", got)
	}
}

func TestStatsAndMedian(t *testing.T) {
	res := &stormResult{
		burstStart: 1e9, cleanAt: 31e9,
		writes: []time.Duration{time.Millisecond, 2 * time.Millisecond, 300 * time.Millisecond},
		probes: []probeRec{
			{at: 0, pwrite: time.Millisecond, sync: time.Millisecond},
			{at: 1, pwrite: 0, sync: 99 * time.Millisecond},
			{at: 2, pwrite: 2 * time.Millisecond, sync: 99 * time.Millisecond}, // 101 ms in the call: a stall
			{at: 3, sync: 5 * time.Second},
		},
		samples: []stormSample{{dirty: 10, wb: 0}, {dirty: 8, wb: 7}, {dirty: 0, wb: 3}},
	}
	st := res.stats()
	if st.probes != 4 || st.max != 5*time.Second || st.p50 != 99*time.Millisecond || st.pwriteMax != 2*time.Millisecond {
		t.Errorf("probe stats %+v", st)
	}
	if st.stalled != 5*time.Second+101*time.Millisecond {
		t.Errorf("stalled %v", st.stalled)
	}
	if st.wMax != 300*time.Millisecond || st.wP99 != 300*time.Millisecond {
		t.Errorf("writer stats %v %v", st.wP99, st.wMax)
	}
	if st.toClean != 30*time.Second || st.peakDirty != 10 || st.peakBoth != 15 {
		t.Errorf("clean %v, peaks %d %d", st.toClean, st.peakDirty, st.peakBoth)
	}
	res.cleanAt = 0
	if st := res.stats(); st.toClean != notClean || cleanCell(st.toClean, time.Minute) != "not clean (> 1m0s)" {
		t.Errorf("not clean: %v %q", st.toClean, cleanCell(st.toClean, time.Minute))
	}

	a, b, c := stormStats{max: 3, toClean: notClean, peakDirty: 1}, stormStats{max: 1, toClean: 5, peakDirty: 3}, stormStats{max: 2, toClean: 7, peakDirty: 2}
	m := medianStats([]stormStats{a, b, c})
	if m.max != 2 || m.toClean != 7 || m.peakDirty != 2 {
		t.Errorf("median %+v", m)
	}
	// Two of three not clean: the median is not clean.
	if m := medianStats([]stormStats{a, a, c}); m.toClean != notClean {
		t.Errorf("median toClean %v", m.toClean)
	}
}

func TestParseBytes(t *testing.T) {
	for s, want := range map[string]int64{"41943040": 41943040, "256MiB": 256 << 20, "1GiB": 1 << 30, "4K": 4096, "2 M": 2 << 20, "7B": 7} {
		if got, err := parseBytes(s); err != nil || got != want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
	for _, s := range []string{"", "MiB", "1.5GiB", "1GB", "99999999999GiB", "-1"} {
		if _, err := parseBytes(s); err == nil {
			t.Errorf("parseBytes(%q): no error", s)
		}
	}
}

func TestThrottleOfAndStackTop(t *testing.T) {
	data := []byte("7:3 41943040\n254:0 1000\n")
	if got := throttleOf(data, "7:3"); got != "41943040" {
		t.Errorf("7:3: %q", got)
	}
	if got := throttleOf(data, "7:30"); got != "0" {
		t.Errorf("absent: %q", got)
	}
	stack := "[<0>] folio_wait_bit_common+0x13c/0x340\n[<0>] folio_wait_writeback+0x2b/0x80\n[<0>] __filemap_fdatawait_range+0x8d/0xf0\n[<0>] file_write_and_wait_range+0x8e/0xb0\n"
	if got, want := stackTop(stack, 3), "folio_wait_bit_common < folio_wait_writeback < __filemap_fdatawait_range"; got != want {
		t.Errorf("stackTop = %q", got)
	}
	if got := stackTop("", 3); got != "(no stack: it had woken up)" {
		t.Errorf("empty stack: %q", got)
	}
}

func TestKnobStack(t *testing.T) {
	var order []string
	var ks knobStack
	a := ks.push("a", func() error { order = append(order, "a"); return nil })
	ks.push("b", func() error { order = append(order, "b"); return nil })
	ks.push("c", func() error { order = append(order, "c"); return nil })
	if !ks.restore(a) {
		t.Error("restore failed")
	}
	if !ks.restore(a) {
		t.Error("a second restore of the same knob failed (it must be a no-op)")
	}
	if !ks.restoreAll() {
		t.Error("restoreAll failed")
	}
	ks.restoreAll()
	if got := len(order); got != 3 || order[0] != "a" || order[1] != "c" || order[2] != "b" {
		t.Errorf("undo order %v, want [a c b], each once", order)
	}
}

func TestEstimateError(t *testing.T) {
	med, worst := estimateError([]estSample{{est: 10, truth: 10}, {est: 4, truth: 10}, {est: 13, truth: 10}})
	if med != 3 || worst != 6 {
		t.Errorf("estimateError = %d, %d; want median 3, largest 6", med, worst)
	}
	dir := t.TempDir()
	p := dir + "/stats"
	if _, ok := reclaimable(p); ok {
		t.Error("a missing stats file read as an estimate")
	}
	os.WriteFile(p, []byte("BdiWriteback:               12 kB\nBdiReclaimable:           4000 kB\n"), 0o644)
	if n, ok := reclaimable(p); !ok || n != 4000*1024 {
		t.Errorf("reclaimable = %d, %v; want 4096000, true", n, ok)
	}
}

// TestWarmUp: the warm-up waits until its file is written back (here by a
// sync made meanwhile), removes it, and reports a file still dirty at the
// end of its wait.
func TestWarmUp(t *testing.T) {
	dir := t.TempDir()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	if st.Type == unix.TMPFS_MAGIC {
		t.Skip("the temporary directory is on tmpfs, which has no writeback")
	}
	path := filepath.Join(dir, "warmup")
	d := &daemon{done: make(chan struct{})} // (running)
	go func() {
		time.Sleep(300 * time.Millisecond)
		unix.Sync()
	}()
	start := time.Now()
	if err := warmUp(context.Background(), d, path, 4<<20, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Errorf("returned after %v, before anything wrote the file back", d)
	}
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the warm-up file is left: %v", err)
	}
	// No wait: the pages just written are still dirty at the first look.
	if err := warmUp(context.Background(), d, path, 4<<20, 0); err == nil || !strings.Contains(err.Error(), "dirty") {
		t.Errorf("a file left dirty: err = %v, want the pages still dirty", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the warm-up file is left after a failure: %v", err)
	}
}

// TestStormWriteSize: --write-size is the bulk writer's write(2) size, a
// multiple of 4 KiB from 4 KiB to 16 MiB; anything else is a usage error
// (exit 2), and the default is 1 MiB.
func TestStormWriteSize(t *testing.T) {
	for _, c := range []struct {
		arg  string
		want int64
	}{{"", writeChunk}, {"128KiB", 128 << 10}, {"4KiB", 4096}, {"16MiB", 16 << 20}, {"3000", 0}, {"0", 0}, {"32MiB", 0}, {"6KiB", 0}, {"x", 0}} {
		args := []string{"--methods", "f"}
		if c.arg != "" {
			args = append(args, "--write-size", c.arg)
		}
		o, code, _ := stormOptions(args)
		switch {
		case c.want == 0 && code != 2:
			t.Errorf("--write-size %q: exit %d, want 2", c.arg, code)
		case c.want != 0 && (code == 2 || o.writeSize != c.want):
			t.Errorf("--write-size %q: exit %d, size %d; want %d", c.arg, code, o.writeSize, c.want)
		}
	}
}
