package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"flusherd/bdi"
	"flusherd/control"
	"flusherd/internal/testfs"
	"flusherd/internal/testwait"
)

// Writers that dirty a file with no event (no write(2): no FAN_MODIFY).
// Each writes for about 3 s, prints "written" after its last write, then
// holds the file (its mapping, its descriptor or its environment) for 8 s
// more, and exits.
const (
	// mmapWriter maps an 8 MiB file MAP_SHARED, with its descriptor
	// kept open (argv[2] "open") or closed after the mmap, and writes 4
	// KiB into the mapping every 100 ms.
	mmapWriter = `
import mmap, os, sys, time
path, keep = sys.argv[1], sys.argv[2] == "open"
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
os.ftruncate(fd, 8 << 20)
m = mmap.mmap(fd, 8 << 20, mmap.MAP_SHARED)
if not keep:
    os.close(fd)
time.sleep(0.5)
for i in range(30):
    m[i*4096*10:i*4096*10+4096] = b"x"*4096
    time.sleep(0.1)
print("written", flush=True)
time.sleep(8)
m.close()
if keep:
    os.close(fd)
`
	// lmdbWriter commits a record every 100 ms to an LMDB environment
	// opened with writemap=True, sync=False: every commit goes through
	// the shared mapping of data.mdb.
	lmdbWriter = `
import lmdb, sys, time
env = lmdb.open(sys.argv[1], map_size=64<<20, writemap=True, sync=False)
time.sleep(0.5)
for i in range(30):
    with env.begin(write=True) as t:
        t.put(b"k%d" % i, b"v" * 3000)
    time.sleep(0.1)
print("written", flush=True)
time.sleep(8)
env.close()
`
)

// python returns a python3 that can import module: the one on PATH, or
// Debian's (/usr/bin/python3), where python3-lmdb installs.
func python(t *testing.T, module, pkg string) string {
	t.Helper()
	for _, p := range []string{"python3", "/usr/bin/python3"} {
		if exec.Command(p, "-c", "import "+module).Run() == nil {
			return p
		}
	}
	testfs.Missing(t, "no python3 with the module %s (Debian's %s)", module, pkg)
	return ""
}

// proc is a running writer; done is closed when it has exited.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// start starts cmd, and kills it at cleanup.
func start(t *testing.T, cmd *exec.Cmd) *proc {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(p.done) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-p.done })
	return p
}

// alive reports whether the writer still runs (holds its file).
func (p *proc) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// startWriter runs a writer and returns once it printed "written" (its
// last write), with the time then; the writer holds its file on.
func startWriter(t *testing.T, cmd *exec.Cmd) (*proc, time.Time) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	var errb strings.Builder
	cmd.Stdout, cmd.Stderr = w, &errb
	p := start(t, cmd)
	w.Close()
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "written" {
		<-p.done
		t.Fatalf("%s: %q, %v\n%s", cmd, line, err, errb.String())
	}
	go func() { io.Copy(io.Discard, r); r.Close() }()
	return p, time.Now()
}

// sweepBound is how soon data written with no event is clean under
// sweepDaemon's configuration: expire (1 s) + sweep interval (auto: 500 ms)
// + the slack of a kupdate period (500 ms) and of the check (1 s).
const sweepBound = time.Second + 500*time.Millisecond + 500*time.Millisecond + time.Second

// sweepDaemon mounts an ext4 of sizeMB and runs flusherd with backend on
// its directory data (expire 1 s, interval 500 ms), with args added to
// run's.
func sweepDaemon(t *testing.T, backend string, sizeMB int, args ...string) (*testfs.FS, string, *flusherdProc) {
	t.Helper()
	mnt := testfs.Mount(t, testfs.Options{Type: "ext4", SizeMB: sizeMB})
	root := filepath.Join(mnt.Dir, "data")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	d := runDaemon(t, fmt.Sprintf(`
[writeback]
dirty_writeback_interval = "500ms"
[watcher]
backend = %q
[[watch]]
path = %q
expire = "1s"
`, backend, root), daemonOpts{args: args})
	return mnt, root, d
}

// cleanWhileHeld waits until path has no dirty or writeback page, by
// sweepBound after last (its writer's last write), and fails the test
// if it does not, or if the writer ended first (its close would have
// reported the file).
func cleanWhileHeld(t *testing.T, path string, writer *proc, last time.Time) {
	t.Helper()
	var dirty, wb uint64
	var err error
	ok := testwait.Poll(time.Until(last.Add(sweepBound)), func() bool {
		dirty, wb, err = cachestat(path, 0, 0)
		return err == nil && dirty == 0 && wb == 0
	})
	if !ok {
		t.Fatalf("%s: %d dirty, %d writeback pages (%v) past the bound (expire + sweep_interval + slack, %v after the last write)",
			path, dirty, wb, err, sweepBound)
	}
	if !writer.alive() {
		t.Fatalf("the writer of %s ended before its file was clean (its close would have reported it)", path)
	}
}

// TestSweepWritesWithoutEvents: data written with no event (through a
// shared mapping, its descriptor kept open or closed after the mmap; LMDB
// with writemap; Linux AIO, buffered) to a file a process holds open or
// mapped is written back within the tree's expire (1 s) + the sweep
// interval (auto: 500 ms) + the slack of a kupdate period (500 ms) and of
// the check (1 s), while the writer still holds it; cachestat from the
// test says so. The device's stats and flusherd status count the files
// found, and a debug line names one. Both backends: inotify learns the
// opens from IN_OPEN and the closes, fanotify from FAN_OPEN and FAN_CLOSE.
func TestSweepWritesWithoutEvents(t *testing.T) {
	testfs.SkipShort(t, "the daemon on loop-mounted ext4, with writers running for 10 s")
	for _, backend := range []string{"fanotify", "inotify"} {
		t.Run(backend, func(t *testing.T) { sweepWritesWithoutEvents(t, backend) })
	}
}

func sweepWritesWithoutEvents(t *testing.T, backend string) {
	mnt, root, d := sweepDaemon(t, backend, 256, "--log-level", "debug")
	t.Run("mmap-fd-open", func(t *testing.T) {
		py := python(t, "mmap", "python3")
		p := filepath.Join(root, "mapped-open")
		w, last := startWriter(t, exec.Command(py, "-c", mmapWriter, p, "open"))
		cleanWhileHeld(t, p, w, last)
	})
	t.Run("mmap-fd-closed", func(t *testing.T) {
		py := python(t, "mmap", "python3")
		p := filepath.Join(root, "mapped-closed")
		w, last := startWriter(t, exec.Command(py, "-c", mmapWriter, p, "closed"))
		cleanWhileHeld(t, p, w, last)
	})
	t.Run("lmdb-writemap", func(t *testing.T) {
		py := python(t, "lmdb", "python3-lmdb")
		env := filepath.Join(root, "lmdb")
		if err := os.Mkdir(env, 0o755); err != nil {
			t.Fatal(err)
		}
		w, last := startWriter(t, exec.Command(py, "-c", lmdbWriter, env))
		cleanWhileHeld(t, filepath.Join(env, "data.mdb"), w, last)
	})
	t.Run("fio-libaio-buffered", func(t *testing.T) {
		fio, err := exec.LookPath("fio")
		if err != nil {
			testfs.Missing(t, "fio is not installed (Debian's fio)")
		}
		p := filepath.Join(root, "aio")
		// Paced at 1 MiB/s over 10 s, the file open throughout: dirty
		// data older than the bound would pile up at that rate (2,272
		// pages at 10 s without the sweep).
		cmd := exec.Command(fio, "--name=aio", "--filename="+p, "--ioengine=libaio", "--direct=0", "--rw=write",
			"--bs=4k", "--size=16m", "--rate=1m", "--runtime=10", "--time_based", "--iodepth=4")
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		fioProc := start(t, cmd)
		began := time.Now()
		page := uint64(os.Getpagesize())
		// At most a bound's worth of writes dirty at any time after
		// the first bound (plus a second's: fio's pacing is bursty).
		limit := uint64((sweepBound+time.Second).Seconds()*float64(1<<20)) / page
		var most uint64
		for time.Since(began) < 9500*time.Millisecond {
			time.Sleep(200 * time.Millisecond)
			if time.Since(began) < sweepBound+time.Second {
				continue
			}
			if !fioProc.alive() {
				t.Fatalf("fio ended early:\n%s", out.String())
			}
			dirty, wb, err := cachestat(p, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			most = max(most, dirty+wb)
		}
		if most > limit {
			t.Errorf("up to %d dirty and writeback pages of %s while fio wrote 1 MiB/s, want at most %d (%v of writes)", most, p, limit, sweepBound+time.Second)
		}
		if most == 0 {
			t.Errorf("fio left no page of %s dirty at any look: the test saw no write to sweep", p)
		}
		t.Logf("fio libaio: at most %d pages dirty or under writeback (limit %d)", most, limit)
	})
	// The stats file is rewritten at most every stats interval and
	// status is read live, both from one snapshot function: a sweep
	// between the two reads makes them differ for one interval. They
	// must agree once the file is rewritten, and status is never behind.
	var st bdi.Stats
	var status control.Status
	var mismatch string
	agree := func() bool {
		data, err := os.ReadFile(d.devStats(mnt.MajMin))
		if err != nil {
			t.Fatal(err)
		}
		if st, err = bdi.ParseStats(data, os.Getpagesize()); err != nil {
			t.Fatalf("%v:\n%s", err, data)
		}
		var out, errb bytes.Buffer
		if code := Main([]string{"status", "--json", "--stats-dir", d.statsDir}, &out, &errb); code != 0 {
			t.Fatalf("flusherd status: exit %d: %s", code, errb.String())
		}
		status = control.Status{}
		if err := json.Unmarshal(out.Bytes(), &status); err != nil {
			t.Fatalf("%v\n%s", err, out.String())
		}
		if len(status.Devices) != 1 || status.Devices[0].SweepFound < st.SweepFound {
			t.Fatalf("flusherd status: devices %+v, want one with sweep_found at least %d, the stats file's read before it", status.Devices, st.SweepFound)
		}
		mismatch = fmt.Sprintf("status sweep_found %d, stats file %d", status.Devices[0].SweepFound, st.SweepFound)
		return status.Devices[0].SweepFound == st.SweepFound
	}
	if !testwait.Poll(10*time.Second, agree) {
		t.Errorf("flusherd status and the stats file disagree for 10 s: %s", mismatch)
	}
	if st.SweepFound == 0 {
		t.Errorf("the device's stats count no file found by the sweep: %+v", st)
	}
	if !strings.Contains(d.log.String(), "found by the sweep") {
		t.Errorf("no debug line names a file found by the sweep")
	}
}

const (
	// closesMerged opens argv[1] twice, with an open of argv[2]
	// between (so that the two opens are not merged), holds them past
	// the inotify watcher's grace, then closes the two descriptors of
	// argv[1] back to back (their IN_CLOSE_NOWRITE events merge into
	// one), and argv[2] after; then it sleeps, holding nothing.
	closesMerged = `
import os, sys, time
a = os.open(sys.argv[1], os.O_RDONLY)
g = os.open(sys.argv[2], os.O_RDONLY)
b = os.open(sys.argv[1], os.O_RDONLY)
time.sleep(0.6)
os.close(a); os.close(b)
time.sleep(0.3)
os.close(g)
print("written", flush=True)
time.sleep(20)
`
	// opensMerged opens argv[1] for reading and for writing back to
	// back (their IN_OPEN events merge into one), maps it shared from
	// the second, closes both descriptors after the grace (the reader's
	// first), then writes 4 KiB into the mapping every 100 ms for 3 s
	// and holds the mapping 8 s more.
	opensMerged = `
import mmap, os, sys, time
path = sys.argv[1]
r = os.open(path, os.O_RDONLY)
w = os.open(path, os.O_RDWR)
m = mmap.mmap(w, 8 << 20, mmap.MAP_SHARED)
time.sleep(0.6)
os.close(r)
os.close(w)
time.sleep(1)
for i in range(30):
    m[i*4096*10:i*4096*10+4096] = b"x"*4096
    time.sleep(0.1)
print("written", flush=True)
time.sleep(8)
m.close()
`
)

// TestSweepMergedEvents: inotify merges two like events of one file in a
// row, so its open counts can be wrong. Two closes merged: the file, open
// for reading only and then closed, is no candidate of the sweep after the
// watcher's probe and the sweep's next look (2 s). Two opens merged, a
// reader's and a writer's, and the reader's close taking the count to 0:
// the file, still mapped by the writer, stays a candidate, and data
// written through the mapping afterwards is clean within the bound of
// TestSweepWritesWithoutEvents while the writer holds it.
func TestSweepMergedEvents(t *testing.T) {
	testfs.SkipShort(t, "the daemon on loop-mounted ext4, with writers running for 10 s")
	py := python(t, "mmap", "python3")
	mnt, root, d := sweepDaemon(t, "inotify", 128)
	candidates := func() int {
		t.Helper()
		data, err := os.ReadFile(d.devStats(mnt.MajMin))
		if err != nil {
			return -1 // no device yet
		}
		st, err := bdi.ParseStats(data, os.Getpagesize())
		if err != nil {
			t.Fatal(err)
		}
		return st.SweepCandidates
	}
	t.Run("closes-merged", func(t *testing.T) {
		f, g := filepath.Join(root, "read-twice"), filepath.Join(root, "other")
		for _, p := range []string{f, g} {
			if err := os.WriteFile(p, make([]byte, 8192), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		r, _ := startWriter(t, exec.Command(py, "-c", closesMerged, f, g))
		n := -1
		if !testwait.Poll(2*time.Second, func() bool { n = candidates(); return n == 0 }) {
			t.Errorf("%d sweep candidates 2 s after every descriptor was closed, want 0", n)
		}
		if !r.alive() {
			t.Fatal("the reader exited: its exit, not the probe, may have ended the count")
		}
	})
	t.Run("opens-merged", func(t *testing.T) {
		p := filepath.Join(root, "mapped")
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(p, 8<<20); err != nil {
			t.Fatal(err)
		}
		w, last := startWriter(t, exec.Command(py, "-c", opensMerged, p))
		cleanWhileHeld(t, p, w, last)
	})
}
