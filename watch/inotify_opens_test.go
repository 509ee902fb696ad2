package watch

import (
	"os"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sys/unix"

	"flusherd/bdi"
	"flusherd/inode"
	"flusherd/internal/faultfs"
	"flusherd/internal/testwait"
	"flusherd/policy"
	"flusherd/tree"
)

// TestInotifyOpens: the inotify watcher reports a name to the sweep only
// once it has stayed open for openGrace: an open closed within it (the
// daemon's own, whose events name no process) makes no report, and a
// later close reports it closed, asking the candidate to linger; a name
// opened twice is closed by its second close; a rename or removal of the
// name ends its count; a close with no open counted, and a directory,
// make none.
func TestInotifyOpens(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		tr := tree.Tree{Root: dir, Recursive: true, Expire: time.Minute}
		s := &openSink{}
		w := opensWatcher(tr, s, Options{Opens: true})
		w.opens.probe = func(string, inode.Key) policy.Writers { return policy.WritersUnknown }
		file := func(name string) string {
			p := filepath.Join(dir, name)
			if err := os.WriteFile(p, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			return p
		}
		short, held, twice, moved, sub := file("short"), file("held"), file("twice"), file("moved"), filepath.Join(dir, "sub")
		if err := os.Mkdir(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		ev := func(name string, op inotifyOp) { w.handle(inotifyEvent{Name: name, Op: op}) }
		ev(short, opOpen)
		ev(held, opOpen)
		ev(twice, opOpen)
		ev(twice, opOpen)
		ev(moved, opOpen)
		ev(sub, opOpen)
		ev(file("never"), opClose)
		time.Sleep(openGrace / 2)
		ev(short, opClose)
		time.Sleep(openGrace)
		w.reportOpens(time.Now())
		got := map[string]bdi.Open{}
		for _, o := range s.opens {
			got[o.Path] = o
		}
		heldKey, _, err := inode.Stat(held)
		if err != nil {
			t.Fatal(err)
		}
		if o, ok := got[held]; !ok || !o.Open || o.Closes == 1 || !o.Linger || o.Key != heldKey || o.Tree.Root != dir {
			t.Errorf("held open past the grace: report %+v (ok %v), want an open with its key, tree and Linger", o, ok)
		}
		for _, p := range []string{short, sub, filepath.Join(dir, "never")} {
			if o, ok := got[p]; ok {
				t.Errorf("%s reported: %+v", p, o)
			}
		}
		if len(s.opens) != 3 {
			t.Errorf("%d reports, want 3 (held, twice, moved): %+v", len(s.opens), s.opens)
		}
		s.opens = nil
		ev(held, opClose)
		ev(twice, opClose)
		if len(s.opens) != 0 {
			t.Errorf("closes reported before their probe: %+v", s.opens)
		}
		time.Sleep(openGrace)
		w.reportOpens(time.Now())
		closed := map[string]bool{}
		for _, o := range s.opens {
			if o.Closes != 1 || o.Open || !o.Linger {
				t.Errorf("report %+v, want a close that lingers", o)
			}
			closed[o.Path] = true
		}
		if !closed[held] || closed[twice] || len(s.opens) != 1 {
			t.Errorf("closes reported %v, want held only (twice is open once more)", closed)
		}
		s.opens = nil
		ev(twice, opClose)
		time.Sleep(openGrace)
		w.reportOpens(time.Now())
		if len(s.opens) != 1 || s.opens[0].Path != twice || s.opens[0].Closes != 1 {
			t.Errorf("after the second close of twice: %+v", s.opens)
		}
		// (Last: a rename's other handling looks at the tree's root,
		// which this watcher, never started, does not know.)
		s.opens = nil
		ev(moved, opRename)
		if len(s.opens) != 1 || s.opens[0].Path != moved || s.opens[0].Closes != 1 || !s.opens[0].Linger {
			t.Errorf("after a rename of an open name: %+v, want it closed", s.opens)
		}
	})
}

// TestInotifyOpensRenamed: a file renamed while open keeps its count
// under its new name (IN_MOVED_FROM and IN_MOVED_TO by their cookie),
// and the sink is told its new path; so do the files below a renamed
// directory; a file renamed out of the trees (no IN_MOVED_TO) is reported
// closed at the end of the batch.
func TestInotifyOpensRenamed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		tr := tree.Tree{Root: dir, Recursive: true, Expire: time.Minute}
		s := &openSink{}
		w := opensWatcher(tr, s, Options{Opens: true})
		w.opens.probe = func(string, inode.Key) policy.Writers { return policy.WritersUnknown }
		sub := filepath.Join(dir, "sub")
		if err := os.Mkdir(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		a, b, out := filepath.Join(dir, "a"), filepath.Join(sub, "b"), filepath.Join(dir, "out")
		for _, p := range []string{a, b, out} {
			if err := os.WriteFile(p, nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		for _, p := range []string{a, b, out} {
			w.openEvent(tr, inotifyEvent{Name: p, Op: opOpen})
		}
		time.Sleep(openGrace + time.Millisecond)
		w.reportOpens(time.Now())
		s.opens = nil
		a2, sub2 := filepath.Join(dir, "a2"), filepath.Join(dir, "sub2")
		w.openMovedFrom(inotifyEvent{Name: a, Op: opRename, Cookie: 1})
		w.openMovedTo(tr, inotifyEvent{Name: a2, Op: opCreate, Cookie: 1})
		w.openMovedFrom(inotifyEvent{Name: sub, Op: opRename, Cookie: 2, Dir: true})
		// The pair split across two batches, as the reader may.
		w.endMoves()
		w.openMovedTo(tr, inotifyEvent{Name: sub2, Op: opCreate, Cookie: 2, Dir: true})
		w.openMovedFrom(inotifyEvent{Name: out, Op: opRename, Cookie: 3})
		paths := map[string]bdi.Open{}
		for _, o := range s.opens {
			paths[o.Path] = o
		}
		for _, p := range []string{a2, filepath.Join(sub2, "b")} {
			if o, ok := paths[p]; !ok || o.Open || o.Closes == 1 {
				t.Errorf("%s: report %+v (ok %v), want its new path, neither open nor closed", p, o, ok)
			}
		}
		if len(s.opens) != 2 {
			t.Errorf("reports %+v, want the two new paths", s.opens)
		}
		s.opens = nil
		w.endMoves()
		if len(s.opens) != 0 {
			t.Errorf("after the batch of its IN_MOVED_FROM: %+v, want the file moved out still waiting", s.opens)
		}
		w.endMoves()
		if len(s.opens) != 1 || s.opens[0].Closes != 1 {
			t.Errorf("after the next batch: %+v, want the file moved out reported closed", s.opens)
		}
		s.opens = nil
		w.openEvent(tr, inotifyEvent{Name: a2, Op: opClose})
		w.openEvent(tr, inotifyEvent{Name: filepath.Join(sub2, "b"), Op: opClose})
		time.Sleep(openGrace)
		w.reportOpens(time.Now())
		if len(s.opens) != 2 || s.opens[0].Closes != 1 || s.opens[1].Closes != 1 {
			t.Errorf("closes under the new names: %+v, want both closed", s.opens)
		}
		if n := len(w.opens.names); n != 0 {
			t.Errorf("%d counts left", n)
		}
	})
}

// TestInotifyOpensProbed: counts that inotify's merged events leave wrong
// are checked by a probe for writers openGrace after a close. Two closes
// merged (a count left above 0) with no writer: reported closed. Two
// opens merged (a count taken to 0) with a writer holding the file: kept,
// and let go after the writer's close. A probe that found a writer is not
// made again at a reader's close (the probe's own open and close are
// such), only after an IN_CLOSE_WRITE. Events lost: every reported count
// is checked at once. With real descriptors, the real
// probe (a read lease) tells a writer from a reader.
func TestInotifyOpensProbed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		tr := tree.Tree{Root: dir, Recursive: true, Expire: time.Minute}
		s := &openSink{}
		w := opensWatcher(tr, s, Options{Opens: true})
		probes := map[string]int{}
		w.opens.probe = func(p string, k inode.Key) policy.Writers {
			probes[p]++
			return w.opens.probeWriters(p, k)
		}
		readers, writer := filepath.Join(dir, "readers"), filepath.Join(dir, "writer")
		for _, p := range []string{readers, writer} {
			if err := os.WriteFile(p, make([]byte, 4096), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		ev := func(name string, op inotifyOp) { w.handle(inotifyEvent{Name: name, Op: op}) }
		settle := func() {
			time.Sleep(openGrace)
			w.reportOpens(time.Now())
		}
		wf, err := os.OpenFile(writer, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer wf.Close()
		if held, err := inode.HeldForWrite(writer, inode.Key{}); err != nil || !held {
			t.Skipf("no read leases here (HeldForWrite %v, %v)", held, err)
		}
		ev(readers, opOpen)
		ev(readers, opOpen)
		ev(writer, opOpen) // with a reader's open, merged
		settle()
		if len(s.opens) != 2 {
			t.Fatalf("reports %+v, want both open", s.opens)
		}
		s.opens = nil
		ev(readers, opClose) // one of two merged closes
		ev(writer, opClose)  // the reader's close
		settle()
		if len(s.opens) != 1 || s.opens[0].Path != readers || s.opens[0].Closes != 1 {
			t.Errorf("after the probes: %+v, want readers closed and writer kept", s.opens)
		}
		if c := w.opens.names[writer]; c == nil || c.n != 1 || !c.settled {
			t.Fatalf("writer's count %+v, want 1, settled", c)
		}
		s.opens = nil
		// The probe's own open and close, and another reader's: no
		// probe, the writer being known.
		before := probes[writer]
		ev(writer, opOpen)
		ev(writer, opClose)
		settle()
		if probes[writer] != before || len(s.opens) != 0 {
			t.Errorf("a reader's close after a writer was found: %d probes more, reports %+v", probes[writer]-before, s.opens)
		}
		// Events lost (an overflow): every count is dropped and
		// checked; the writer's file is kept, the other let go.
		other := filepath.Join(dir, "other")
		if err := os.WriteFile(other, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		ev(other, opOpen)
		settle()
		s.opens = nil
		w.dropOpens()
		settle()
		if len(s.opens) != 1 || s.opens[0].Path != other || s.opens[0].Closes != 1 {
			t.Errorf("after events were lost: %+v, want other closed and writer kept", s.opens)
		}
		if c := w.opens.names[writer]; c == nil || c.n != 1 {
			t.Fatalf("writer's count after events were lost: %+v, want 1", c)
		}
		s.opens = nil
		// The writer's close: probed, and let go.
		if err := wf.Close(); err != nil {
			t.Fatal(err)
		}
		ev(writer, opClose|opCloseWrite)
		settle()
		if len(s.opens) != 1 || s.opens[0].Path != writer || s.opens[0].Closes != 1 {
			t.Errorf("after the writer's close: %+v, want writer closed", s.opens)
		}
		if n := len(w.opens.names); n != 0 {
			t.Errorf("%d counts left", n)
		}
	})
}

// TestInotifyProbeStalled: a probe whose open stalls (a FUSE server that
// does not answer OPEN for 2 s) is given up after probeWait, as unknown;
// until it returns, the next probe is not made and answers unknown at
// once; once it has returned, probes are made again.
func TestInotifyProbeStalled(t *testing.T) {
	fs := faultfs.MountT(t)
	p := filepath.Join(fs.Dir, "f")
	if err := os.WriteFile(p, make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	key, _, err := inode.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	var o inotifyOpens
	const delay = 2 * time.Second
	fs.Set(faultfs.Faults{OpenDelay: delay})
	began := time.Now()
	if got := o.probeWriters(p, key); got != policy.WritersUnknown {
		t.Errorf("a stalled probe: %v, want unknown", got)
	}
	if took := time.Since(began); took > probeWait+delay/4 {
		t.Errorf("a stalled probe took %v, want about %v", took, probeWait)
	}
	opens := fs.Count("open")
	if got := o.probeWriters(p, key); got != policy.WritersUnknown || fs.Count("open") != opens {
		t.Errorf("a probe while one is stalled: %v and %d opens more, want unknown and none", got, fs.Count("open")-opens)
	}
	fs.Set(faultfs.Faults{})
	if !testwait.Poll(2*delay, func() bool { return !o.stuck.Load() }) {
		t.Fatal("the stalled probe never returned")
	}
	o.probeWriters(p, key)
	if fs.Count("open") == opens {
		t.Errorf("no probe made after the stalled one returned")
	}
}

// TestInotifyProbeRefused: a probe refused (EACCES: another user's file
// and no CAP_LEASE) leaves the count believed, and is logged once, at the
// first refusal, naming CAP_LEASE.
func TestInotifyProbeRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		tr := tree.Tree{Root: dir, Recursive: true, Expire: time.Minute}
		s := &openSink{}
		core, logs := observer.New(zap.InfoLevel)
		w := opensWatcher(tr, s, Options{Opens: true, Log: zap.New(core)})
		w.opens.probe = func(string, inode.Key) policy.Writers {
			err := error(&os.PathError{Op: "fcntl F_SETLEASE", Path: "f", Err: unix.EACCES})
			w.opens.refused.CompareAndSwap(nil, &err)
			return policy.WritersUnknown
		}
		var files []string
		for _, n := range []string{"a", "b"} {
			p := filepath.Join(dir, n)
			if err := os.WriteFile(p, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			files = append(files, p)
			w.handle(inotifyEvent{Name: p, Op: opOpen})
			w.handle(inotifyEvent{Name: p, Op: opOpen})
		}
		time.Sleep(openGrace)
		w.reportOpens(time.Now())
		s.opens = nil
		for _, p := range files {
			w.handle(inotifyEvent{Name: p, Op: opClose})
		}
		time.Sleep(openGrace)
		w.reportOpens(time.Now())
		if len(s.opens) != 0 {
			t.Errorf("reports %+v after a refused probe, want the counts (1 each) believed", s.opens)
		}
		msgs := logs.FilterMessageSnippet("CAP_LEASE").All()
		if len(msgs) != 1 {
			t.Errorf("%d log lines name CAP_LEASE, want 1: %+v", len(msgs), logs.All())
		}
	})
}

// opensWatcher is an inotify Watcher, never started, of tree tr with
// opts (Opens: true for these tests), reporting to s.
func opensWatcher(tr tree.Tree, s *openSink, opts Options) *Watcher {
	w := &Watcher{dirs: map[string]inode.Key{}, unwatched: map[string]tree.Tree{}, keys: map[string]inode.Key{}, keyNames: map[inode.Key]int32{}, gone: map[string]*goneName{}, goneLooked: map[string]bool{}, looked: map[string]bool{}}
	w.init([]tree.Tree{tr}, sinkOf(s), opts)
	return w
}
