package blk

import (
	"fmt"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
)

type rng struct {
	dev, ino  uint64
	off, n    int64
	integrity bool
	merged    int
}

func toReqs(owner *int, rs []rng) []*Request[*int] {
	var out []*Request[*int]
	for _, r := range rs {
		out = append(out, &Request[*int]{Dev: r.dev, Ino: r.ino, Off: r.off, Len: r.n, Integrity: r.integrity, Owner: owner, Merged: r.merged})
	}
	return out
}

func fromReqs(rs []*Request[*int]) []rng {
	var out []rng
	for _, r := range rs {
		out = append(out, rng{r.Dev, r.Ino, r.Off, r.Len, r.Integrity, r.Merged})
	}
	return out
}

// recorder is a Plug.Submit that records each batch.
type recorder struct{ batches [][]rng }

func (r *recorder) submit(b []*Request[*int]) { r.batches = append(r.batches, fromReqs(b)) }

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
		{"a merge away from offset 0",
			[]rng{{1, 1, 12, 4, false, 0}, {1, 1, 8, 4, false, 0}, {1, 1, 14, 6, false, 0}},
			[]rng{{1, 1, 8, 12, false, 2}}},
		{"merged requests count what they had absorbed",
			[]rng{{1, 1, 0, 4, false, 3}, {1, 1, 4, 4, false, 2}},
			[]rng{{1, 1, 0, 8, false, 6}}},
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
			got := fromReqs(SortAndMerge(toReqs(new(int), tc.in)))
			if d := cmp.Diff(tc.want, got, cmp.AllowUnexported(rng{})); d != "" {
				t.Errorf("(-want +got)\n%s", d)
			}
		})
	}
}

func TestPlugNesting(t *testing.T) {
	var rec recorder
	p := Plug[*int]{Enabled: true, MaxPending: 256, Submit: rec.submit}
	owner := new(int)
	p.Start()
	p.Add(toReqs(owner, []rng{{1, 2, 0, 4, false, 0}})[0])
	p.Start() // nested
	p.Add(toReqs(owner, []rng{{1, 1, 0, 4, false, 0}})[0])
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
	p := Plug[*int]{Enabled: true, MaxPending: 256, Submit: rec.submit}
	p.Start()
	p.Start()
	p.Add(toReqs(new(int), []rng{{1, 1, 0, 4, false, 0}})[0])
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
	p := Plug[*int]{Enabled: true, MaxPending: 3, Submit: rec.submit}
	p.Start()
	p.Start()
	for i := range 7 {
		p.Add(toReqs(new(int), []rng{{1, uint64(i), 0, 4, false, 0}})[0])
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
	p := Plug[*int]{Enabled: false, MaxPending: 256, Submit: rec.submit}
	p.Start()
	for i := range 3 {
		p.Add(toReqs(new(int), []rng{{1, 1, int64(i) * 4, 4, false, 0}})[0])
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
	var p Plug[*int]
	p.Finish()
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
			var batch []*Request[*int]
			for _, e := range tc.errs {
				batch = append(batch, &Request[*int]{Err: e})
			}
			got := Result(batch)
			if got.Requests != len(tc.errs) || got.Unsupported != tc.unsup || got.IOError != tc.ioer {
				t.Errorf("Result = %+v, want unsupported %v, io %v", got, tc.unsup, tc.ioer)
			}
		})
	}
}
