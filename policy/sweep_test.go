package policy

import (
	"testing"
	"time"
)

func TestSweepEvery(t *testing.T) {
	for _, c := range []struct {
		configured, expire, want time.Duration
	}{
		{SweepAuto, 30 * time.Second, 15 * time.Second},
		{SweepAuto, time.Second, 500 * time.Millisecond},
		{SweepAuto, time.Microsecond, time.Millisecond},
		{0, 30 * time.Second, 0},
		{2 * time.Second, 30 * time.Second, 2 * time.Second},
		{2 * time.Second, time.Second, 2 * time.Second},
	} {
		if got := SweepEvery(c.configured, c.expire); got != c.want {
			t.Errorf("SweepEvery(%v, %v) = %v, want %v", c.configured, c.expire, got, c.want)
		}
	}
}

func TestOpens(t *testing.T) {
	for _, c := range []struct {
		n      int
		open   bool
		closes int
		want   int
		low    bool
	}{
		{0, true, 0, 1, false},
		{1, true, 0, 2, false},
		{2, false, 1, 1, false},
		{1, false, 1, 0, false},
		{0, false, 1, 0, false}, // a close of an open made before the watch
		{3, false, 2, 1, false}, // a writer's and a reader's close merged
		{1, false, 2, 0, false},
		{1, true, 1, 1, true}, // merged open and close
		{0, true, 1, 0, true},
		// Written, closed, opened to read and closed, the last three
		// merged: the writer's open was counted before.
		{1, true, 2, 0, true},
		{0, true, 2, 0, true}, // (all of it merged)
		{3, false, 0, 3, false},
	} {
		got, low := Opens(c.n, c.open, c.closes)
		if got != c.want || low != c.low {
			t.Errorf("Opens(%d, open %v, closes %d) = %d, %v, want %d, %v", c.n, c.open, c.closes, got, low, c.want, c.low)
		}
	}
}

func TestOpenCountAfterProbe(t *testing.T) {
	for _, c := range []struct {
		n        int32
		w        Writers
		keep     bool
		count    int32
		settled  bool
		scenario string
	}{
		{0, WritersSome, true, 1, true, "two opens merged: the writer still holds it"},
		{2, WritersSome, true, 2, true, "a writer and a reader"},
		{1, WritersNone, false, 0, false, "two closes merged: nobody writes"},
		{3, WritersNone, false, 0, false, "readers only"},
		{0, WritersNone, false, 0, false, "closed"},
		{2, WritersUnknown, true, 2, true, "no lease: the count is believed"},
		{0, WritersUnknown, false, 0, false, "no lease: the count is believed"},
	} {
		keep, count, settled := OpenCountAfterProbe(c.n, c.w)
		if keep != c.keep || count != c.count || settled != c.settled {
			t.Errorf("%s: OpenCountAfterProbe(%d, %d) = %v, %d, %v; want %v, %d, %v",
				c.scenario, c.n, c.w, keep, count, settled, c.keep, c.count, c.settled)
		}
	}
}
