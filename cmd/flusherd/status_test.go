package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"flusherd/control"
	"flusherd/internal/testfs"
	"flusherd/internal/testwait"
)

// TestStatusPerTree: two trees on one filesystem, a writeback tree with a
// 2 s expiry and an integrity tree with a 6 s one. flusherd status gives
// each its own line: its file, its dirty bytes within 10 % of a cachestat
// of that file before any attempt, then, once the writeback tree's file
// has been written, its exposure (from the write to the attempt: the
// expiry and at most a pass later), while the integrity tree's file stays
// dirty and its oldest dirty age stays under its expiry; and the writeback
// tree's written bytes once that write is verified.
func TestStatusPerTree(t *testing.T) {
	testfs.SkipShort(t, "the daemon on loop-mounted ext4")
	mnt := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: 128})
	logs, spool := filepath.Join(mnt.Dir, "logs"), filepath.Join(mnt.Dir, "spool")
	for _, d := range []string{logs, spool} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	d := startDaemon(t, fmt.Sprintf(`
[writeback]
dirty_writeback_interval = "500ms"
[[watch]]
path = %q
expire = "2s"
[[watch]]
path = %q
mode = "integrity"
expire = "6s"
`, logs, spool))
	status := func() map[string]control.TreeStatus {
		var out, errb bytes.Buffer
		if code := Main([]string{"status", "--json", "--stats-dir", d.statsDir}, &out, &errb); code != 0 {
			t.Fatalf("flusherd status: exit %d: %s", code, errb.String())
		}
		var st control.Status
		if err := json.Unmarshal(out.Bytes(), &st); err != nil {
			t.Fatalf("%v\n%s", err, out.String())
		}
		m := map[string]control.TreeStatus{}
		for _, tr := range st.Trees {
			m[string(tr.Root)] = tr
		}
		return m
	}
	a, b := filepath.Join(logs, "a"), filepath.Join(spool, "b")
	writeDirty(t, a, 4<<20)
	wrote := time.Now()
	writeDirty(t, b, 2<<20)
	within := func(got, want uint64) bool {
		return float64(got) >= 0.9*float64(want) && float64(got) <= 1.1*float64(want)
	}
	var st map[string]control.TreeStatus
	ok := testwait.Poll(1500*time.Millisecond, func() bool {
		st = status()
		da, _, _ := cachestat(a, 0, 0)
		db, _, _ := cachestat(b, 0, 0)
		return st[logs].Tracked == 1 && st[spool].Tracked == 1 && da > 0 &&
			within(st[logs].DirtyBytes, da*uint64(os.Getpagesize())) && within(st[spool].DirtyBytes, db*uint64(os.Getpagesize()))
	})
	if !ok {
		t.Fatalf("before any attempt, want each tree's file tracked and its dirty bytes within 10%% of cachestat; status %+v", st)
	}
	if st[logs].Mode != "writeback" || st[spool].Mode != "integrity" || st[logs].ExpireSeconds != 2 || st[spool].ExpireSeconds != 6 {
		t.Errorf("settings: %+v %+v", st[logs], st[spool])
	}
	waitClean(t, a, 10*time.Second)
	exposed := time.Since(wrote).Seconds()
	testwait.For(t, "the logs tree's file's exposure counted", 5*time.Second, func() bool {
		st = status()
		return st[logs].Exposure.Count == 1
	})
	if e := st[logs].Exposure.MaxSeconds; e < 2 || e > exposed+0.5 {
		t.Errorf("exposure of the logs tree's file: %.2fs, want between its expiry (2s) and %.2fs", e, exposed)
	}
	if s := st[spool]; s.Tracked != 1 || s.WrittenBytes != 0 || s.Exposure.Count != 0 || s.OldestDirtySeconds <= 0 || s.OldestDirtySeconds >= 6 {
		t.Errorf("the spool tree, its file not due: %+v", s)
	}
	// The logs tree's written bytes count once verified: the filesystem's
	// error cursor is read when nothing is tracked dirty there (after the
	// spool file's writeback: a read before would write it early) and
	// nothing else in the system is, or 30 s (bdi's verifyBound) after the
	// write.
	testwait.For(t, "the logs tree's file's bytes counted as written", 40*time.Second, func() bool {
		st = status()
		return within(st[logs].WrittenBytes, 4<<20) && st[spool].Tracked == 0
	})
}
