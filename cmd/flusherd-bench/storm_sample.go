package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// stormWrites is what the bulk writer reported: its first write and its
// end (monotonic ns) and each write(2)'s latency.
type stormWrites struct {
	start, end int64
	writes     []time.Duration
	err        error
}

// readWrites reads the writer's lines until its "done" line, and sends
// what it reported (or why it stopped early) on the channel.
func readWrites(writer *stormChild) <-chan stormWrites {
	wdone := make(chan stormWrites, 1)
	go func() {
		var w stormWrites
		for line := range writer.lines {
			f := strings.Fields(line)
			switch {
			case len(f) == 3 && f[0] == "w":
				d, _ := strconv.ParseInt(f[2], 10, 64)
				w.writes = append(w.writes, time.Duration(d))
			case len(f) == 3 && f[0] == "done":
				w.start, _ = strconv.ParseInt(f[1], 10, 64)
				w.end, _ = strconv.ParseInt(f[2], 10, 64)
				wdone <- w
				return
			}
		}
		w.err = fmt.Errorf("writer exited early: %v", writer.wait())
		wdone <- w
	}()
	return wdone
}

// stormSampler samples a run: the burst file, the probe's threads, and
// with method f the daemon and its stats file.
type stormSampler struct {
	bf        *os.File
	probeDir  string
	probePid  int     // 0: no waits sampled
	notBefore int64   // the run goes on at least until then (monotonic ns)
	d         *daemon // nil but for method f
	statsFile string
}

// untilClean samples every sampleEvery into res until the writer has
// finished and the burst file is clean (res.cleanAt) and notBefore has
// passed (res.endAt is the last sample), or until deadline
// (monotonic ns). It returns whether the writer finished; an error if the
// context is cancelled, the daemon or the writer exits, or cachestat fails.
func (s stormSampler) untilClean(ctx context.Context, res *stormResult, wdone <-chan stormWrites, deadline int64) (bool, error) {
	var daemonDone <-chan struct{}
	if s.d != nil {
		daemonDone = s.d.done
	}
	tick := time.NewTicker(sampleEvery)
	defer tick.Stop()
	writerFinished := false
	for {
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-daemonDone:
			return false, errors.New("flusherd exited during the run")
		case w := <-wdone:
			if w.err != nil {
				return false, w.err
			}
			res.burstStart, res.burstEnd, res.writes = w.start, w.end, w.writes
			writerFinished = true
			continue
		case <-tick.C:
		}
		now := monoNow()
		dirty, wb, err := s.sample(res, now)
		if err != nil {
			return false, err
		}
		if writerFinished && dirty+wb == 0 && res.cleanAt == 0 {
			res.cleanAt = now
		}
		res.endAt = now
		if res.cleanAt != 0 && now >= s.notBefore {
			return true, nil
		}
		if now > deadline {
			return writerFinished, nil
		}
	}
}

// sample records the burst file's dirty and writeback bytes at now, every
// estimateEvery the tree's dirty bytes (every method) beside the daemon's
// estimate (method f), and the probe's waits.
func (s stormSampler) sample(res *stormResult, now int64) (dirty, wb uint64, err error) {
	dirty, wb, err = cachestatBytes(s.bf)
	if err != nil {
		return 0, 0, err
	}
	res.samples = append(res.samples, stormSample{at: now, dirty: dirty, wb: wb})
	if now-res.estAt >= int64(estimateEvery) {
		res.estAt = now
		truth := dirty + dirtyUnder(s.probeDir)
		if s.d != nil {
			if est, ok := reclaimable(s.statsFile); ok {
				res.ests = append(res.ests, estSample{est: est, truth: truth})
			}
		}
	}
	if s.probePid != 0 {
		res.sampleWaits(s.probePid)
	}
	return dirty, wb, nil
}

// reclaimable reads BdiReclaimable (kB) from a flusherd stats file, in
// bytes; false when the file is not there yet or has no such line.
func reclaimable(path string) (uint64, bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	for l := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(l, "BdiReclaimable:"); ok {
			f := strings.Fields(v)
			if len(f) == 0 {
				return 0, false
			}
			n, err := strconv.ParseUint(f[0], 10, 64)
			return n * 1024, err == nil
		}
	}
	return 0, false
}

// cachestatPath is cachestatBytes of the file at path.
func cachestatPath(path string) (uint64, uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	return cachestatBytes(f)
}

// dirtyUnder is the dirty bytes of the regular files under dir (those
// that cannot be read count 0).
func dirtyUnder(dir string) uint64 {
	var n uint64
	filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err == nil && e.Type().IsRegular() {
			d, _, _ := cachestatPath(p)
			n += d
		}
		return nil
	})
	return n
}

// cachestatBytes returns the dirty and writeback bytes of the whole file.
func cachestatBytes(f *os.File) (uint64, uint64, error) {
	var cs unix.Cachestat_t
	if err := unix.Cachestat(uint(f.Fd()), &unix.CachestatRange{}, &cs, 0); err != nil {
		return 0, 0, fmt.Errorf("cachestat %s: %w", f.Name(), err)
	}
	pg := uint64(os.Getpagesize())
	return cs.Dirty * pg, cs.Writeback * pg, nil
}

// sampleWaits records where the probe's threads in D state wait: the top
// frames of each one's kernel stack (/proc/PID/task/TID/stack).
func (res *stormResult) sampleWaits(pid int) {
	tids, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	for _, t := range tids {
		stat, err := os.ReadFile(t + "/stat")
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 || i+2 >= len(stat) || stat[i+2] != 'D' {
			continue
		}
		stack, err := os.ReadFile(t + "/stack")
		if err != nil {
			continue
		}
		res.waits[stackTop(string(stack), 3)]++
		res.waitSamples++
	}
}

// stackTop returns the first n function names of a /proc/PID/stack, the
// innermost first, joined by " < ".
func stackTop(stack string, n int) string {
	var fns []string
	for line := range strings.Lines(stack) {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		fn, _, _ := strings.Cut(f[1], "+")
		fns = append(fns, fn)
		if len(fns) == n {
			break
		}
	}
	if len(fns) == 0 {
		return "(no stack: it had woken up)"
	}
	return strings.Join(fns, " < ")
}
