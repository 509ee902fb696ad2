package bdi

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite golden files")

type rng struct {
	dev, ino  uint64
	off, n    int64
	integrity bool
	merged    int
}

func toReqs(att *attempt, rs []rng) []*Request {
	var out []*Request
	for _, r := range rs {
		out = append(out, &Request{Dev: r.dev, Ino: r.ino, Off: r.off, Len: r.n, Integrity: r.integrity, att: att})
	}
	return out
}

func fromReqs(rs []*Request) []rng {
	var out []rng
	for _, r := range rs {
		out = append(out, rng{r.Dev, r.Ino, r.Off, r.Len, r.Integrity, r.Merged})
	}
	return out
}

func TestSortAndMerge(t *testing.T) {
	tests := []struct {
		name string
		in   []rng
		want []rng
	}{
		{"empty", nil, nil},
		{"sorted by dev, ino, off",
			[]rng{{2, 1, 0, 4, false, 0}, {1, 9, 8, 4, false, 0}, {1, 3, 0, 4, false, 0}},
			[]rng{{1, 3, 0, 4, false, 0}, {1, 9, 8, 4, false, 0}, {2, 1, 0, 4, false, 0}}},
		{"adjacent ranges merge",
			[]rng{{1, 1, 4, 4, false, 0}, {1, 1, 0, 4, false, 0}, {1, 1, 8, 4, false, 0}},
			[]rng{{1, 1, 0, 12, false, 2}}},
		{"overlap merges to the union",
			[]rng{{1, 1, 0, 10, false, 0}, {1, 1, 5, 10, false, 0}, {1, 1, 6, 2, false, 0}},
			[]rng{{1, 1, 0, 15, false, 2}}},
		{"gap does not merge",
			[]rng{{1, 1, 0, 4, false, 0}, {1, 1, 5, 4, false, 0}},
			[]rng{{1, 1, 0, 4, false, 0}, {1, 1, 5, 4, false, 0}}},
		{"to-EOF absorbs what follows",
			[]rng{{1, 1, 4, 0, false, 0}, {1, 1, 100, 4, false, 0}, {1, 1, 0, 4, false, 0}},
			[]rng{{1, 1, 0, 0, false, 2}}},
		{"different files do not merge",
			[]rng{{1, 1, 0, 4, false, 0}, {1, 2, 4, 4, false, 0}},
			[]rng{{1, 1, 0, 4, false, 0}, {1, 2, 4, 4, false, 0}}},
		{"modes do not merge",
			[]rng{{1, 1, 0, 4, true, 0}, {1, 1, 4, 4, false, 0}},
			[]rng{{1, 1, 0, 4, true, 0}, {1, 1, 4, 4, false, 0}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := fromReqs(SortAndMerge(toReqs(&attempt{}, tc.in)))
			if d := cmp.Diff(tc.want, got, cmp.AllowUnexported(rng{})); d != "" {
				t.Errorf("(-want +got)\n%s", d)
			}
		})
	}
}

// recorder is a Plug.Submit that records each batch.
type recorder struct{ batches [][]rng }

func (r *recorder) submit(b []*Request) { r.batches = append(r.batches, fromReqs(b)) }

func TestPlugNesting(t *testing.T) {
	var rec recorder
	p := Plug{Enabled: true, MaxPending: 256, Submit: rec.submit}
	att := &attempt{}
	p.Start()
	p.Add(toReqs(att, []rng{{1, 2, 0, 4, false, 0}})[0])
	p.Start() // nested
	p.Add(toReqs(att, []rng{{1, 1, 0, 4, false, 0}})[0])
	p.Finish() // inner finish: no submit
	if len(rec.batches) != 0 || p.Pending() != 2 {
		t.Fatalf("inner Finish submitted %v (pending %d)", rec.batches, p.Pending())
	}
	p.Finish() // outer: one sorted batch
	want := [][]rng{{{1, 1, 0, 4, false, 0}, {1, 2, 0, 4, false, 0}}}
	if d := cmp.Diff(want, rec.batches, cmp.AllowUnexported(rng{})); d != "" {
		t.Fatalf("outer Finish (-want +got)\n%s", d)
	}
	if p.Batches != 1 || p.Requests != 2 {
		t.Errorf("counters: batches %d requests %d", p.Batches, p.Requests)
	}
}

func TestPlugFlushNow(t *testing.T) {
	var rec recorder
	p := Plug{Enabled: true, MaxPending: 256, Submit: rec.submit}
	p.Start()
	p.Start()
	p.Add(toReqs(&attempt{}, []rng{{1, 1, 0, 4, false, 0}})[0])
	p.Flush() // explicit: goes out at once, inside two plugs
	if len(rec.batches) != 1 || p.Pending() != 0 {
		t.Fatalf("FlushPlug did not submit: %v", rec.batches)
	}
	p.Finish()
	p.Finish()
	if len(rec.batches) != 1 {
		t.Fatalf("empty Finish submitted again: %v", rec.batches)
	}
}

func TestPlugFlushWhenFull(t *testing.T) {
	var rec recorder
	p := Plug{Enabled: true, MaxPending: 3, Submit: rec.submit}
	p.Start()
	p.Start()
	for i := range 7 {
		p.Add(toReqs(&attempt{}, []rng{{1, uint64(i), 0, 4, false, 0}})[0])
	}
	if len(rec.batches) != 2 || len(rec.batches[0]) != 3 || len(rec.batches[1]) != 3 {
		t.Fatalf("want two full batches of 3 while nested, got %v", rec.batches)
	}
	p.Finish()
	p.Finish()
	if len(rec.batches) != 3 || len(rec.batches[2]) != 1 {
		t.Fatalf("want the last request in a third batch, got %v", rec.batches)
	}
}

func TestPlugDisabledSubmitsEachRequest(t *testing.T) {
	var rec recorder
	p := Plug{Enabled: false, MaxPending: 256, Submit: rec.submit}
	p.Start()
	for i := range 3 {
		p.Add(toReqs(&attempt{}, []rng{{1, 1, int64(i) * 4, 4, false, 0}})[0])
	}
	p.Finish()
	if len(rec.batches) != 3 || p.Merges != 0 {
		t.Fatalf("disabled plug: batches %v merges %d, want 3 single batches, no merges", rec.batches, p.Merges)
	}
}

func TestFinishWithoutStartPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	var p Plug
	p.Finish()
}

func TestStatsGolden(t *testing.T) {
	s := Stats{
		BdiWriteback: 3, BdiReclaimable: 1000, BdiDirtyThresh: 1219097, DirtyThresh: 1219097,
		BackgroundThresh: 608804, BdiDirtied: 54715, BdiWritten: 53715, BdiWriteBandwidth: 102400,
		BDirty: 17, BIO: 2, BMoreIO: 1, BMoreIOWait: 4, BdiList: 1, State: WBRegistered | WBHasDirtyIO,
		PlugRequests: 3000, PlugMerges: 120, PlugBatches: 17, RetryPauseMs: 40, WritebackErrors: 2, InodesGone: 1, Rescans: 3, FailedFiles: 2, Throttled: 5, DetachedCalls: 7, ListLockMaxUs: 120, LoopStallMaxUs: 2500,
	}
	var buf bytes.Buffer
	if err := s.Format(&buf, 4096); err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "stats.golden")
	if *update {
		os.WriteFile(golden, buf.Bytes(), 0o644)
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(string(want), buf.String()); d != "" {
		t.Errorf("stats format (-golden +got)\n%s", d)
	}
}

// TestStatsKernelPrefix: the kernel's fields come first, in its order and
// padding; flusherd's own are b_more_io_wait (after b_more_io) and the
// lines after state.
func TestStatsKernelPrefix(t *testing.T) {
	kernel, err := os.ReadFile(filepath.Join("testdata", "kernel-stats"))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	(&Stats{}).Format(&buf, 4096)
	keys := func(b []byte) []string {
		var out []string
		for _, l := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
			out = append(out, string(l[:20])) // name and padding
		}
		return out
	}
	var ours []string
	for _, k := range keys(buf.Bytes()) {
		if k != "b_more_io_wait:     " {
			ours = append(ours, k)
		}
	}
	kk := keys(kernel)
	if d := cmp.Diff(kk, ours[:len(kk)]); d != "" {
		t.Errorf("kernel fields differ (-kernel +ours)\n%s", d)
	}
}

func TestBatchResultErrorClasses(t *testing.T) {
	eio := fmt.Errorf("sync_file_range: %w", syscall.EIO)
	einval := fmt.Errorf("sync_file_range: %w", syscall.EINVAL)
	enospc := fmt.Errorf("fdatasync: %w", syscall.ENOSPC)
	eopnotsupp := fmt.Errorf("sync_file_range: %w", syscall.EOPNOTSUPP)
	tests := []struct {
		name        string
		errs        []error
		unsup, ioer error
	}{
		{"all ok", []error{nil, nil}, nil, nil},
		{"first of each class", []error{nil, eio, einval, enospc, eopnotsupp}, einval, eio},
		{"only unsupported", []error{eopnotsupp, einval}, eopnotsupp, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var batch []*Request
			for _, e := range tc.errs {
				batch = append(batch, &Request{err: e})
			}
			got := Result(batch)
			if got.Requests != len(tc.errs) || got.Unsupported != tc.unsup || got.IOError != tc.ioer {
				t.Errorf("Result = %+v, want unsupported %v, io %v", got, tc.unsup, tc.ioer)
			}
		})
	}
}
