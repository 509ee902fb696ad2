package bdi

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"flusherd/inode"
	"flusherd/tree"
)

// newIdleWB returns a device's Writeback over a fakeFS whose goroutine is
// not running, for calling its steps directly; *now is its clock.
func newIdleWB(t *testing.T, cfg Config) (*Writeback, *fakeFS, *time.Duration) {
	t.Helper()
	if os.Getpagesize() != pg {
		t.Fatalf("page size %d, the fake assumes %d", os.Getpagesize(), pg)
	}
	var now time.Duration
	clock := func() time.Duration { return now }
	fs := newFakeFS(clock)
	return New("7:0", cfg, clock, Files{Opener: fs}, nil, nil), fs, &now
}

// TestCongested: a device is congested once the writeback pages of its
// tracked files reach max_inflight, the asking file's own count replaced by
// the one just read; each deferral is counted; max_inflight 0 never is.
func TestCongested(t *testing.T) {
	cfg := testConfig()
	cfg.MaxInflight = 10 * pg
	wb, _, _ := newIdleWB(t, cfg)
	self := inode.New(inode.Key{Dev: 7, Ino: 1})
	wb.mu.Lock()
	wb.inodes.Set(self)
	wb.setPagesLocked(self, 0, 100)
	for ino, pages := range map[uint64]uint64{2: 4, 3: 3} {
		in := inode.New(inode.Key{Dev: 7, Ino: ino})
		wb.inodes.Set(in)
		wb.setPagesLocked(in, 0, pages)
	}
	wb.mu.Unlock()
	for _, tc := range []struct {
		wbp  uint64
		want bool
	}{
		{0, false}, // 7 pages in the others
		{2, false}, // 9
		{3, true},  // 10: at the bound
		{4, true},
	} {
		before := wb.Snapshot().Throttled
		if got := wb.congested(self, tc.wbp, wb.cfg.MaxInflight); got != tc.want {
			t.Errorf("own writeback %d pages, others 7, bound 10: congested = %v, want %v", tc.wbp, got, tc.want)
		}
		counted := wb.Snapshot().Throttled - before
		if want := map[bool]uint64{true: 1, false: 0}[tc.want]; counted != want {
			t.Errorf("own writeback %d: throttled counted %d, want %d", tc.wbp, counted, want)
		}
	}
	if wb.congested(self, 1<<30, 0) {
		t.Error("max_inflight 0 (no bound): congested")
	}
}

// TestRanges: the windows a worker writes of a file holding more than
// write_chunk, from the inode's writeback index onwards, wrapping at the
// end, and where the index is left (write_chunk 4 pages). Bisection halves
// the region (rounded down to pages) until it is at most write_chunk long,
// keeping the half with the first dirty page, so a window starts at most
// write_chunk before it; adjacent windows are folded into one.
func TestRanges(t *testing.T) {
	for _, tc := range []struct {
		name      string
		size      int64
		dirty     []int64 // dirty pages
		start     int64   // writeback index before, -1: none
		want      []window
		queued    int64
		chunkUsed bool
		merged    uint64
		index     int64 // after; 0: none kept
	}{
		{"one window uses the chunk", 16 * pg, []int64{0, 1, 2, 3, 8, 9, 10, 11}, -1,
			[]window{{Off: 0, Len: 4 * pg}}, 4, true, 0, 4 * pg},
		{"from the index, two windows folded", 16 * pg, []int64{0, 1, 2, 3, 8, 9, 10, 11}, 4 * pg,
			[]window{{Off: 7 * pg, Len: 8 * pg}}, 4, true, 1, 15 * pg},
		{"index at the end restarts", 16 * pg, []int64{0, 1, 2, 3, 4}, 16 * pg,
			[]window{{Off: 0, Len: 4 * pg}}, 4, true, 0, 4 * pg},
		{"negative index restarts", 16 * pg, []int64{0, 1, 2, 3, 4}, -4 * pg,
			[]window{{Off: 0, Len: 4 * pg}}, 4, true, 0, 4 * pg},
		{"sparse: bisection finds each window", 16 * pg, []int64{1, 14}, -1,
			[]window{{Off: 0, Len: 4 * pg}, {Off: 13 * pg, Len: 3 * pg}}, 2, false, 0, 0},
		{"wraps to the start", 16 * pg, []int64{2, 3, 9}, 8 * pg,
			[]window{{Off: 8 * pg, Len: 4 * pg}, {Off: 0, Len: 4 * pg}}, 3, false, 0, 8 * pg},
		{"ends mid-file", 16 * pg, []int64{5, 6, 7, 8, 9}, -1,
			[]window{{Off: 4 * pg, Len: 8 * pg}}, 5, true, 1, 12 * pg},
		{"used up at the end: the index restarts", 16 * pg, []int64{12, 13, 14, 15}, 12 * pg,
			[]window{{Off: 12 * pg, Len: 4 * pg}}, 4, true, 0, 0},
		{"unaligned size", 10*pg + 100, []int64{9, 10}, -1,
			[]window{{Off: 7 * pg, Len: 3*pg + 100}}, 2, false, 0, 0},
		{"dirty only past the size seen: the whole file", 4 * pg, []int64{6, 7, 8, 9, 10}, -1,
			[]window{{Off: 0, Len: 0}}, 0, false, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.WriteChunk = 4 * pg
			wb, fs, _ := newIdleWB(t, cfg)
			f := fs.add("/f", 1, tc.size, 0)
			for _, p := range tc.dirty {
				f.dirty[p] = true
			}
			h, err := fs.Open("/f", f.key)
			if err != nil {
				t.Fatal(err)
			}
			if tc.start != -1 {
				wb.mu.Lock()
				wb.side.wbIndex[f.key] = tc.start
				wb.mu.Unlock()
			}
			got, queued, used, merged, err := wb.ranges(h, f.key, 4*pg)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("windows (-want +got):\n%s", diff)
			}
			if queued != tc.queued || used != tc.chunkUsed || merged != tc.merged {
				t.Errorf("%d dirty pages found, chunk used %v, %d folded; want %d, %v, %d", queued, used, merged, tc.queued, tc.chunkUsed, tc.merged)
			}
			wb.mu.Lock()
			index, kept := wb.side.wbIndex[f.key]
			wb.mu.Unlock()
			if index != tc.index || kept != (tc.index != 0) {
				t.Errorf("writeback index after = %d (kept %v), want %d", index, kept, tc.index)
			}
		})
	}
}

// TestRangesScattered: a file whose dirty pages are scattered over a huge
// sparse range (a VM image, a database written at random) takes
// maxRangeWindows windows one by one, then the rest of the budget as one
// range, found by a single bisection: its cachestat calls (each linear in
// the pages it covers) stay near maxRangeWindows bisections, not one per
// dirty page. The range still holds exactly the budget's dirty pages,
// the first ones from the writeback index.
func TestRangesScattered(t *testing.T) {
	const (
		chunkPages = 64
		spacing    = 1 << 20 // pages between dirty pages
		dirtyN     = 200
	)
	cfg := testConfig()
	cfg.WriteChunk = chunkPages * pg
	wb, fs, _ := newIdleWB(t, cfg)
	f := fs.add("/f", 1, 1<<40, 0)
	for i := range int64(dirtyN) {
		f.dirty[i*spacing] = true
	}
	h, err := fs.Open("/f", f.key)
	if err != nil {
		t.Fatal(err)
	}
	wins, queued, used, _, err := wb.ranges(h, f.key, chunkPages*pg)
	if err != nil {
		t.Fatal(err)
	}
	if queued != chunkPages || !used {
		t.Errorf("%d dirty pages found, chunk used %v; want %d, true", queued, used, chunkPages)
	}
	covered := map[int64]bool{}
	for _, w := range wins {
		for p := range f.dirty {
			if p*pg >= w.Off && p*pg < w.Off+w.Len {
				covered[p] = true
			}
		}
	}
	for i := range int64(dirtyN) {
		if want := i < chunkPages; covered[i*spacing] != want {
			t.Errorf("dirty page %d (the %dth) in the windows: %v, want %v", i*spacing, i, covered[i*spacing], want)
		}
	}
	// A window's bisection halves 2^40 bytes down to the chunk (22
	// steps) plus two calls; the last range's halves them down to a page.
	// (One window per dirty page, the budget's 64, made 1,536.)
	if limit := 16*(22+2) + 28 + 4; f.cachestats > limit {
		t.Errorf("%d cachestat calls for %d windows, want at most %d", f.cachestats, len(wins), limit)
	}
	t.Logf("%d windows, %d cachestat calls", len(wins), f.cachestats)
}

// TestRangesCachestatError: a failed cachestat while looking for windows
// fails the attempt, at each of its three places (the region, a bisection
// step, the window's count).
func TestRangesCachestatError(t *testing.T) {
	for fail := 1; fail <= 3; fail++ {
		cfg := testConfig()
		cfg.WriteChunk = 4 * pg
		wb, fs, _ := newIdleWB(t, cfg)
		f := fs.add("/f", 1, 16*pg, 0)
		f.dirty[9] = true
		f.cachestatErrAt = fail
		h, _ := fs.Open("/f", f.key)
		wins, _, _, _, err := wb.ranges(h, f.key, 4*pg)
		if !errors.Is(err, syscall.EIO) || wins != nil {
			t.Errorf("cachestat call %d failed: windows %v, error %v; want none and EIO", fail, wins, err)
		}
	}
}

// TestWriteBandwidth pins wb_update_write_bandwidth's arithmetic: the
// first figure is taken as it is; later ones are folded in with weight
// elapsed/period; avg_write_bandwidth follows write_bandwidth by 1/8 of
// the gap, only when both moved the same way; a period of over 4.096 s
// replaces both.
func TestWriteBandwidth(t *testing.T) {
	for _, tc := range []struct {
		name              string
		old, avg, written uint64
		elapsed           time.Duration
		wantBw, wantAvg   uint64
	}{
		// 2,048,000 bytes in 1 s: 2000 kB/s.
		{"first figure", 0, 0, 2048000, time.Second, 2000, 2000},
		// (4000*1024 ms + 2000*3072 ms) / 4096 ms = 2500; avg < old
		// <= bw: avg += (old-avg)/8 = 1000 + 125.
		{"rising", 2000, 1000, 4194304, 1024 * time.Millisecond, 2500, 1125},
		// (0*1024 + 2000*3072)/4096 = 1500; avg > old >= bw: avg -=
		// (avg-old)/8 = 3000 - 125.
		{"falling", 2000, 3000, 0, 1024 * time.Millisecond, 1500, 2875},
		// bw falls but avg is below old: avg stays.
		{"avg not chasing", 2000, 1000, 0, 1024 * time.Millisecond, 1500, 1000},
		{"over a period", 2000, 1000, 1024000 * 5, 5 * time.Second, 1000, 1000},
	} {
		bw, avg := writeBandwidth(tc.old, tc.avg, tc.written, tc.elapsed)
		if bw != tc.wantBw || avg != tc.wantAvg {
			t.Errorf("%s: writeBandwidth(%d, %d, %d, %v) = %d, %d; want %d, %d", tc.name, tc.old, tc.avg, tc.written, tc.elapsed, bw, avg, tc.wantBw, tc.wantAvg)
		}
	}
}

// TestUpdateBandwidth: the estimator reads the device's completed writes
// (diskWritten) at least bandwidthInterval apart while the device has dirty
// io; the first look only takes a stamp; a period in which nothing was
// written, or a long one that began so, takes a new stamp and keeps the
// figure (a file waiting on b_dirty does not wear it down to 0); a bdi
// without block statistics falls back to flusherd's own written pages.
func TestUpdateBandwidth(t *testing.T) {
	wb, _, now := newIdleWB(t, testConfig())
	var disk uint64
	wb.bw.diskWritten = func() (uint64, error) { return disk, nil }
	wb.MarkInodeDirty(inode.Key{Dev: 7, Ino: 1}, "/f", "", tree.Tree{Expire: time.Hour}) // dirty io
	bw := func() (uint64, uint64) {
		wb.mu.Lock()
		defer wb.mu.Unlock()
		return wb.bw.kBps.Load(), wb.bw.avgKBps.Load()
	}
	step := func(d time.Duration, bytes uint64) {
		*now += d
		disk += bytes
		wb.updateBandwidth(*now)
	}
	step(0, 0) // stamp
	step(100*time.Millisecond, 1<<20)
	if b, _ := bw(); b != 0 {
		t.Fatalf("within bandwidthInterval: %d kB/s, want 0", b)
	}
	// 2 MiB in 200 ms since the stamp: 10240 kB/s.
	step(100*time.Millisecond, 1<<20)
	if b, a := bw(); b != 10240 || a != 10240 {
		t.Fatalf("first period: %d, %d kB/s; want 10240, 10240", b, a)
	}
	// The file waits, nothing is written for 3 s, then 100 MiB within
	// 2 s after that: neither period is a rate.
	step(3*time.Second, 0)
	step(2*time.Second, 100<<20)
	if b, _ := bw(); b != 10240 {
		t.Fatalf("after an idle spell: %d kB/s, want 10240 kept", b)
	}
	// 4 MiB in 400 ms: 10240 kB/s again, folded in.
	step(400*time.Millisecond, 4<<20)
	if b, _ := bw(); b != 10240 {
		t.Fatalf("a busy period after the idle one: %d kB/s, want 10240", b)
	}
	// A shortage reading the stat file (EMFILE) skips the update and
	// keeps the source: the next update reads it again.
	wb.bw.diskWritten = func() (uint64, error) { return 0, &os.PathError{Op: "open", Path: "stat", Err: syscall.EMFILE} }
	*now += 400 * time.Millisecond
	wb.updateBandwidth(*now)
	if wb.bw.diskWritten == nil {
		t.Fatal("an EMFILE reading the device's stat file dropped it as the bandwidth source for good")
	}
	wb.bw.diskWritten = func() (uint64, error) { return disk, nil }
	step(400*time.Millisecond, 4<<20) // 4 MiB in 800 ms since the stamp
	if b, _ := bw(); b == 10240 {
		t.Fatalf("after the shortage the device's writes were not counted: %d kB/s", b)
	}
	// No block statistics: flusherd's written pages (1000 pages of 4 KiB
	// in 400 ms: 10000 kB/s, folded in with weight 400/4096).
	b0, a0 := bw()
	wb.bw.diskWritten = func() (uint64, error) { return 0, os.ErrNotExist }
	wb.updateBandwidth(*now) // falls back, takes a stamp
	wb.mu.Lock()
	wb.acct.written += 1000
	wb.mu.Unlock()
	*now += 400 * time.Millisecond
	wb.updateBandwidth(*now)
	want, _ := writeBandwidth(b0, a0, 1000*pg, 400*time.Millisecond)
	if b, _ := bw(); b != want || wb.bw.diskWritten != nil {
		t.Fatalf("flusherd's own pages: %d kB/s, want %d (diskWritten dropped: %v)", b, want, wb.bw.diskWritten == nil)
	}
}

// TestOffLoopCalls: a call off the device's goroutine counts in
// stuck_calls once it has run longer than attempt_timeout (not at it), and
// says when it returns whether it overran; with no attempt_timeout nothing
// is ever stuck.
func TestOffLoopCalls(t *testing.T) {
	now := new(time.Duration)
	calls := &offLoop{now: func() time.Duration { return *now }}
	timeout := time.Second
	if n := calls.stuck(timeout); n != 0 {
		t.Fatalf("no calls: %d stuck", n)
	}
	a := calls.track(0)
	b := calls.track(500 * time.Millisecond)
	if a == b {
		t.Fatalf("two calls share the id %d", a)
	}
	*now = time.Second
	if n := calls.stuck(timeout); n != 0 {
		t.Errorf("a call at exactly attempt_timeout: %d stuck, want 0", n)
	}
	*now = time.Second + 1
	if n := calls.stuck(timeout); n != 1 {
		t.Errorf("one call past attempt_timeout: %d stuck, want 1", n)
	}
	if took, overran := calls.returned(b, timeout); took != 500*time.Millisecond+1 || overran {
		t.Errorf("call b: took %v, overran %v; want 500ms+1ns, false", took, overran)
	}
	at := calls.track(1)
	if took, overran := calls.returned(at, timeout); took != time.Second || overran {
		t.Errorf("a call of exactly attempt_timeout: took %v, overran %v; want 1s, false", took, overran)
	}
	if took, overran := calls.returned(a, timeout); took != time.Second+1 || !overran {
		t.Errorf("call a: took %v, overran %v; want 1s+1ns, true", took, overran)
	}
	if n := calls.stuck(timeout); n != 0 || calls.running() != 0 {
		t.Errorf("after both returned: %d stuck, %d recorded", n, calls.running())
	}
	timeout = 0
	c := calls.track(0)
	*now = time.Hour
	if n := calls.stuck(timeout); n != 0 {
		t.Errorf("no attempt_timeout: %d stuck", n)
	}
	if _, overran := calls.returned(c, timeout); overran {
		t.Error("no attempt_timeout: overran")
	}
}

// TestErrnoOfAndSatInc: an error's errno as the inode keeps it (LastErr,
// one byte), and the saturating attempt counters.
func TestErrnoOfAndSatInc(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want uint8
	}{
		{syscall.EIO, uint8(syscall.EIO)},
		{ErrAttemptTimeout, uint8(syscall.ETIMEDOUT)},
		{syscall.Errno(inode.ErrnoOther - 1), inode.ErrnoOther - 1},
		{syscall.Errno(inode.ErrnoOther), inode.ErrnoOther},
		{syscall.Errno(300), inode.ErrnoOther},
		{errors.New("not an errno"), inode.ErrnoOther},
	} {
		if got := errnoOf(tc.err); got != tc.want {
			t.Errorf("errnoOf(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
	for _, tc := range []struct{ in, want uint16 }{{0, 1}, {7, 8}, {math.MaxUint16 - 1, math.MaxUint16}, {math.MaxUint16, math.MaxUint16}} {
		if got := satInc(tc.in); got != tc.want {
			t.Errorf("satInc(%d) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

// TestCongestedDefersBigFiles: while the device has max_inflight under
// writeback, a file whose last attempt saw more than write_chunk/4 and at
// most write_chunk dirty is deferred without being opened; smaller files
// are written; bigger ones are opened by their worker, which defers them
// on a fresh count. Once the writeback in flight drops, the
// deferred file is written.
func TestCongestedDefersBigFiles(t *testing.T) {
	cfg := testConfig()
	cfg.DirtyWritebackInterval = time.Second
	cfg.WriteChunk = 16 * pg
	cfg.MaxInflight = 16 * pg
	for _, c := range []struct {
		pages    int
		deferred bool
		opened   bool
	}{
		{4, false, true}, // write_chunk/4: small enough
		{5, true, false},
		{16, true, false}, // write_chunk
		{17, true, true},  // more than write_chunk: its worker looks
	} {
		t.Run(fmt.Sprintf("%d pages", c.pages), func(t *testing.T) {
			withWB(t, cfg, func(h *harness) {
				t := h.t
				busy := h.fs.add("/busy", 1, pg, 1)
				h.mark(busy, time.Hour)
				f := h.fs.add("/f", 2, int64(c.pages)*pg, c.pages)
				h.mark(f, 0)
				// The background check's sample counts both files
				// (one open each) before the kupdate tick.
				time.Sleep(150 * time.Millisecond)
				synctest.Wait()
				if n := h.wb.Snapshot().BdiReclaimable; n != uint64(c.pages)+1 {
					t.Fatalf("dirty pages %d after the sample, want %d", n, c.pages+1)
				}
				sampled := len(h.fs.callsOf("open", "/f"))
				busy.set(func(f *fakeFile) { f.writeback, f.holdWriteback = 16, true }) // a device still writing
				h.wb.mu.Lock()
				h.wb.setPagesLocked(h.wb.inodes.Get(busy.key), 0, 16)
				h.wb.mu.Unlock()
				time.Sleep(950 * time.Millisecond)
				synctest.Wait()
				wrote := len(h.fs.callsOf("sync_file_range", "/f")) > 0
				opened := len(h.fs.callsOf("open", "/f")) > sampled
				if wrote == c.deferred || opened != c.opened {
					t.Fatalf("%d dirty pages, 16 under writeback of 16 allowed: written %v, opened %v; want deferred %v, opened %v",
						c.pages, wrote, opened, c.deferred, c.opened)
				}
				if th := h.wb.Snapshot().Throttled; (th > 0) != c.deferred {
					t.Errorf("throttled = %d, want deferrals counted: %v", th, c.deferred)
				}
				busy.set(func(f *fakeFile) { f.writeback, f.holdWriteback = 0, false })
				h.wb.mu.Lock()
				h.wb.setPagesLocked(h.wb.inodes.Get(busy.key), 0, 0)
				h.wb.mu.Unlock()
				time.Sleep(200 * time.Millisecond) // throttleRetry
				synctest.Wait()
				if len(h.fs.callsOf("sync_file_range", "/f")) == 0 {
					t.Errorf("not written once the device's writeback drained")
				}
			})
		})
	}
}

// roomConfig is testConfig with a 1 s kupdate period, write_chunk 64 pages
// and max_inflight 16, for the tests of the room under the bound.
func roomConfig() Config {
	cfg := testConfig()
	cfg.DirtyWritebackInterval = time.Second
	cfg.WriteChunk = 64 * pg
	cfg.MaxInflight = 16 * pg
	return cfg
}

// firstWrites marks f due now and returns its sync_file_range calls after
// the next kupdate tick.
func firstWrites(h *harness, f *fakeFile) []call {
	h.mark(f, 0)
	time.Sleep(1100 * time.Millisecond)
	synctest.Wait()
	return h.fs.callsOf("sync_file_range", f.path)
}

// inFlight marks a file tracked with pages under writeback as its last
// attempt saw them: the room they take under max_inflight.
func inFlight(h *harness, pages uint32) *fakeFile {
	busy := h.fs.add("/busy", 1, pg, 1)
	h.mark(busy, time.Hour)
	busy.set(func(f *fakeFile) { f.writeback, f.holdWriteback = int(pages), true }) // a device still writing
	h.wb.mu.Lock()
	h.wb.setPagesLocked(h.wb.inodes.Get(busy.key), 0, uint64(pages))
	h.wb.mu.Unlock()
	return busy
}

// TestInflightRoomLimitsTheChunk: a big file's attempt writes no more than
// the room left under max_inflight: 16 pages allowed, 4 under writeback
// in another file, so a window of 12 pages although write_chunk is 64; a
// file of a quarter of the bound or less goes whole, room or not.
func TestInflightRoomLimitsTheChunk(t *testing.T) {
	withWB(t, roomConfig(), func(h *harness) {
		t := h.t
		busy := inFlight(h, 4)
		c := firstWrites(h, h.fs.add("/big", 2, 100*pg, 100))
		if len(c) == 0 || c[0].n != 12*pg {
			t.Fatalf("first write of the big file: %v, want one window of 12 pages (16 allowed, 4 in flight)", c)
		}
		busy.set(func(f *fakeFile) { f.writeback = 16 })
		h.wb.mu.Lock()
		h.wb.setPagesLocked(h.wb.inodes.Get(inode.Key{Dev: 7, Ino: 1}), 0, 16)
		h.wb.mu.Unlock()
		if c := firstWrites(h, h.fs.add("/small", 3, 4*pg, 4)); len(c) != 1 || c[0].n != 0 {
			t.Errorf("a file of a quarter of the bound with no room: %v, want one whole-file write", c)
		}
	})
}

// TestAttemptRelease: the file of an attempt is closed by the last of its
// holders, once.
func TestAttemptRelease(t *testing.T) {
	fs := newFakeFS(func() time.Duration { return 0 })
	ff := fs.add("/a", 1, pg, 1)
	f, _ := fs.Open("/a", ff.key)
	att := &attempt{f: f}
	att.refs.Store(1)
	att.hold()
	att.release()
	if n := len(fs.callsOf("close", "/a")); n != 0 {
		t.Fatalf("closed with a holder left (%d closes)", n)
	}
	att.release()
	if n := len(fs.callsOf("close", "/a")); n != 1 {
		t.Fatalf("%d closes after the last release, want 1", n)
	}
}

// TestSmallFileFollowsTheBound: files up to a quarter of write_chunk go
// whole whatever is in flight, unless max_inflight_bytes is smaller than
// write_chunk: then the share is a quarter of the bound, so a 16 MiB file
// is not written whole past a 1 MiB bound because write_chunk is 64 MiB.
func TestSmallFileFollowsTheBound(t *testing.T) {
	for _, tc := range []struct{ chunk, inflight, want int64 }{
		{4 << 20, 16 << 20, 1 << 20},
		{4 << 20, 0, 1 << 20},
		{64 << 20, 1 << 20, 256 << 10},
		{4 << 20, 4 << 20, 1 << 20},
	} {
		if got := smallFile(tc.chunk, tc.inflight); got != tc.want {
			t.Errorf("smallFile(%d, %d) = %d, want %d", tc.chunk, tc.inflight, got, tc.want)
		}
	}
	withWB(t, roomConfig(), func(h *harness) {
		t := h.t
		inFlight(h, 12)
		// More than 16/4 pages, less than write_chunk/4 (16 pages).
		c := firstWrites(h, h.fs.add("/f", 2, 10*pg, 10))
		if len(c) == 0 || c[0].n != 4*pg {
			t.Errorf("first write of a 10-page file with 12 of 16 pages in flight (write_chunk 64): %v, want one window of the 4 left", c)
		}
	})
}

// TestStaleInflightCountFollowed: with range writeback off and no
// background threshold (no background checks of written files), a file's
// count of pages under writeback, once its device has finished, is read
// again (the background check follows such files whenever
// max_inflight_bytes is set): a file deferred by max_inflight_bytes on
// that count is written at the next tick, not deferred for good. (Six
// 3 MiB files against 1 MiB stayed dirty, deferred hundreds of times,
// until the kernel wrote them; inflight_bytes stayed at 8 MiB.)
func TestStaleInflightCountFollowed(t *testing.T) {
	cfg := testConfig()
	cfg.DirtyWritebackInterval = time.Second
	cfg.WriteChunk = 16 * pg
	cfg.MaxInflight = 16 * pg
	cfg.RangeBytes = 0
	withWB(t, cfg, func(h *harness) {
		t := h.t
		busy := h.fs.add("/busy", 1, pg, 1)
		h.mark(busy, time.Hour)
		f := h.fs.add("/f", 2, 8*pg, 8)
		h.mark(f, 0)
		h.wb.mu.Lock()
		h.wb.setPagesLocked(h.wb.inodes.Get(busy.key), 0, 16) // its last look; the device has finished since
		h.wb.inodes.Get(f.key).DirtyPages = 8
		h.wb.mu.Unlock()
		time.Sleep(2100 * time.Millisecond)
		synctest.Wait()
		if n := f.dirtyCount(); n != 0 {
			t.Errorf("/f still has %d dirty pages: deferred on a stale count of pages under writeback", n)
		}
		if s := h.wb.Snapshot(); s.InflightBytes != 0 {
			t.Errorf("inflight_bytes %d, want 0 (the device finished)", s.InflightBytes)
		}
	})
}

// TestErrLogLeftOut: per-file error lines past errLog's sampling (5 of a
// kind per 10 s) are not lost without a word: logSuppressed says how many
// were left out and where every file is listed, once, then nothing until
// more are left out, and then at most once per sampleTick (a probe
// failing each pass left one line out each pass, and its summary
// replaced it one for one), except at the end.
func TestErrLogLeftOut(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	var now time.Duration
	clock := func() time.Duration { return now }
	wb := New("7:0", testConfig(), clock, Files{Opener: newFakeFS(clock)}, zap.New(core), nil)
	for range 8 {
		wb.errLog.Error("data lost: a writeback of this file failed")
	}
	wb.logSuppressed(false)
	wb.logSuppressed(false)
	if n := logs.FilterMessageSnippet("data lost").Len(); n != 5 {
		t.Errorf("%d data-lost lines logged, want the sampler's 5", n)
	}
	left := logs.FilterMessageSnippet("left out of the log").All()
	if len(left) != 1 || left[0].ContextMap()["lines_left_out"] != uint64(3) || !strings.Contains(left[0].Message, "flusherd dirty") {
		t.Errorf("left-out summary %v, want one line with lines_left_out 3 naming flusherd dirty", left)
	}
	// One more left out at each of 10 passes a second apart: no line
	// until sampleTick has passed since the last, which counts them all.
	for range 10 {
		now += time.Second
		wb.errLog.suppressed.Add(1) // as the sampler's hook does
		wb.logSuppressed(false)
	}
	left = logs.FilterMessageSnippet("left out of the log").All()
	if len(left) != 2 || left[1].ContextMap()["lines_left_out"] != uint64(10) {
		t.Errorf("left-out summaries %v, want a second one, after sampleTick, with lines_left_out 10", left)
	}
	wb.errLog.suppressed.Add(1)
	wb.logSuppressed(true)
	if n := logs.FilterMessageSnippet("left out of the log").Len(); n != 3 {
		t.Errorf("%d left-out summaries after the last pass, want 3", n)
	}
}

// TestWindowPaceChangeLogged: a bandwidth period that changes the pace
// (the slow start doubling it) logs one debug line with the period's
// measurements; a period that changes neither window nor pace logs none.
func TestWindowPaceChangeLogged(t *testing.T) {
	cfg := testConfig()
	cfg.TargetLatency = 25 * time.Millisecond
	var now time.Duration
	clock := func() time.Duration { return now }
	core, logs := observer.New(zap.DebugLevel)
	wb := New("7:0", cfg, clock, Files{Opener: newFakeFS(clock)}, zap.New(core), nil)
	var disk uint64
	wb.bw.diskWritten = func() (uint64, error) { return disk, nil }
	wb.MarkInodeDirty(inode.Key{Dev: 7, Ino: 1}, "/f", "", tree.Tree{Expire: time.Hour}) // dirty io
	step := func(held bool) {
		if held {
			wb.pace.held()
		}
		now += bandwidthInterval
		disk += 4 << 20
		wb.updateBandwidth(now)
	}
	wb.updateBandwidth(now) // stamp
	step(false)
	if n := logs.FilterMessage("in-flight window or pace changed").Len(); n != 0 {
		t.Fatalf("a period that changed nothing logged %d lines", n)
	}
	step(true) // held by the pace: the slow start doubles it
	got := logs.FilterMessage("in-flight window or pace changed").All()
	if len(got) != 1 {
		t.Fatalf("a period that doubled the pace logged %d lines, want 1", len(got))
	}
	f := got[0].ContextMap()
	if got[0].Level != zap.DebugLevel || f["pace"] != float64(2*paceStart) || f["pace_limited"] != true || f["rate"] != uint64(20<<20) {
		t.Errorf("logged %v %v, want debug with pace %d, pace_limited and rate %d", got[0].Level, f, 2*paceStart, 20<<20)
	}
}
