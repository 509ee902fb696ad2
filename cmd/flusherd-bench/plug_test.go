package main

import (
	"testing"

	"flusherd/internal/faultfs"
	"flusherd/internal/testfs"
)

// TestEngineCallsUntilClean: method (g) ends with every file of the set
// clean (cachestat: no dirty and no writeback pages), the state (a) ends
// in, where (h) ends with writes still under way: on an ext4 whose loop
// image lies on a FUSE filesystem paced to 16 MiB/s, 512 files of 16 KiB
// (half a second of writing).
func TestEngineCallsUntilClean(t *testing.T) {
	testfs.SkipShort(t, "ext4 over a paced FUSE image")
	ffs := faultfs.MountWriteThroughT(t)
	m := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 64, ImageDir: ffs.Dir})
	s, err := makeSet(m.Dir, "small", 512, 16<<10)
	if err != nil {
		t.Fatal(err)
	}
	ffs.Set(faultfs.Faults{WriteBPS: 16 << 20})
	t.Cleanup(func() { ffs.Set(faultfs.Faults{}) })
	for _, c := range []struct {
		name  string
		make  func(*fileSet, *plugStat) (func() error, error)
		clean bool
	}{{"h", engineCalls, false}, {"g", engineCallsUntilClean, true}} {
		if err := s.redirty(); err != nil {
			t.Fatal(err)
		}
		run, err := c.make(s, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := run(); err != nil {
			t.Fatal(err)
		}
		n := s.dirtyPages()
		t.Logf("(%s): %d pages dirty or under writeback at its end", c.name, n)
		if c.clean && n != 0 {
			t.Errorf("(%s) ended with %d pages dirty or under writeback: want every file clean", c.name, n)
		}
		if !c.clean && n == 0 {
			t.Errorf("precondition: (%s) ended with every file clean; the device is too fast for the case", c.name)
		}
	}
}
