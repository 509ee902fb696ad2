package main

import (
	"fmt"
	"io"
	"math"
	"os/exec"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

type stormStats struct {
	probes              int
	p50, p99, max       time.Duration // probe fdatasync
	pwriteMax           time.Duration
	stalled             time.Duration // time in probe calls (pwrite+fdatasync) over stallOver
	perSec              float64       // probe calls (commits) per second
	wP99, wMax          time.Duration // writer's write(2)
	toClean             time.Duration // notClean if not clean
	peakDirty, peakBoth uint64
}

// percentile returns the p-th percentile (0 < p ≤ 100) of ds by nearest
// rank: the smallest value that at least p% of the values do not exceed.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// stalledTime is the total time spent in calls longer than over.
func stalledTime(ds []time.Duration, over time.Duration) time.Duration {
	var t time.Duration
	for _, d := range ds {
		if d > over {
			t += d
		}
	}
	return t
}

// peaks returns the largest dirty, and dirty+writeback, of the samples.
func peaks(ss []stormSample) (dirty, both uint64) {
	for _, s := range ss {
		dirty, both = max(dirty, s.dirty), max(both, s.dirty+s.wb)
	}
	return dirty, both
}

func (res *stormResult) stats() stormStats {
	var syncs, calls []time.Duration
	var pw time.Duration
	var first, last int64
	for i, p := range res.probes {
		syncs = append(syncs, p.sync)
		calls = append(calls, p.pwrite+p.sync)
		pw = max(pw, p.pwrite)
		if i == 0 || p.at < first {
			first = p.at
		}
		last = max(last, p.at+int64(p.pwrite+p.sync))
	}
	st := stormStats{
		probes:    len(res.probes),
		p50:       percentile(syncs, 50),
		p99:       percentile(syncs, 99),
		max:       percentile(syncs, 100),
		pwriteMax: pw,
		stalled:   stalledTime(calls, stallOver),
		perSec:    perSecond(len(res.probes), first, last),
		wP99:      percentile(res.writes, 99),
		wMax:      percentile(res.writes, 100),
		toClean:   notClean,
	}
	if res.cleanAt != 0 {
		st.toClean = time.Duration(res.cleanAt - res.burstStart)
	}
	st.peakDirty, st.peakBoth = peaks(res.samples)
	return st
}

// perSecond is n calls over the span from first to last (ns).
func perSecond(n int, first, last int64) float64 {
	if n == 0 || last <= first {
		return 0
	}
	return float64(n) / (float64(last-first) / 1e9)
}

// medianOf returns the median of xs (the upper one of an even count, as
// median does).
func medianOf[T int | uint64 | float64 | time.Duration](xs []T) T {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// medianStats is the field-by-field median of runs.
func medianStats(ss []stormStats) stormStats {
	pick := func(f func(stormStats) time.Duration) time.Duration {
		var v []time.Duration
		for _, s := range ss {
			v = append(v, f(s))
		}
		return medianOf(v)
	}
	pickU := func(f func(stormStats) uint64) uint64 {
		var v []uint64
		for _, s := range ss {
			v = append(v, f(s))
		}
		return medianOf(v)
	}
	var n []int
	var ps []float64
	for _, s := range ss {
		n, ps = append(n, s.probes), append(ps, s.perSec)
	}
	return stormStats{
		probes:    medianOf(n),
		p50:       pick(func(s stormStats) time.Duration { return s.p50 }),
		p99:       pick(func(s stormStats) time.Duration { return s.p99 }),
		max:       pick(func(s stormStats) time.Duration { return s.max }),
		pwriteMax: pick(func(s stormStats) time.Duration { return s.pwriteMax }),
		stalled:   pick(func(s stormStats) time.Duration { return s.stalled }),
		perSec:    medianOf(ps),
		wP99:      pick(func(s stormStats) time.Duration { return s.wP99 }),
		wMax:      pick(func(s stormStats) time.Duration { return s.wMax }),
		toClean:   pick(func(s stormStats) time.Duration { return s.toClean }),
		peakDirty: pickU(func(s stormStats) uint64 { return s.peakDirty }),
		peakBoth:  pickU(func(s stormStats) uint64 { return s.peakBoth }),
	}
}

func fmtMs(d time.Duration) string {
	ms := float64(d) / 1e6
	switch {
	case ms < 10:
		return fmt.Sprintf("%.2f", ms)
	case ms < 1000:
		return fmt.Sprintf("%.1f", ms)
	}
	return fmt.Sprintf("%.0f", ms)
}

func cleanCell(d, maxWait time.Duration) string {
	if d == notClean {
		return fmt.Sprintf("not clean (> %v)", maxWait)
	}
	return fmt.Sprintf("%.1f", d.Seconds())
}

func mibOf(b uint64) string { return fmt.Sprintf("%.1f", float64(b)/(1<<20)) }

// stormHeader is the table's header for probe kind.
func stormHeader(kind string) []string {
	what := "commit"
	if kind == probeFdatasync {
		what = "probe fdatasync"
	}
	return []string{"method", "runs", what + " p50 (ms)", "p99 (ms)", "max (ms)",
		"time in " + what + "s > 100 ms (s)", what + "s/s", "write() p99 (ms)", "write() max (ms)",
		"burst start -> clean (s)", "peak dirty (MiB)", "peak dirty+writeback (MiB)"}
}

func (r *stormRun) statsRow(name, runs string, st stormStats) []string {
	return []string{name, runs, fmtMs(st.p50), fmtMs(st.p99), fmtMs(st.max),
		fmt.Sprintf("%.2f", st.stalled.Seconds()), fmt.Sprintf("%.1f", st.perSec), fmtMs(st.wP99), fmtMs(st.wMax),
		cleanCell(st.toClean, r.o.maxWait), mibOf(st.peakDirty), mibOf(st.peakBoth)}
}

// printReport writes the settings of the runs, the table of medians
// (and with --verbose one row per run), flusherd's estimate error and
// where the probe waited.
func (r *stormRun) printReport(w io.Writer, results map[byte][]*stormResult) {
	r.printSettings(w)
	fmt.Fprintf(w, "\nprobe %s: median of %d interleaved run(s) per method:\n", r.probe, r.o.runs)
	var cells [][]string
	for _, m := range r.o.methods {
		rs := results[m]
		if len(rs) == 0 {
			continue
		}
		var ss []stormStats
		for _, res := range rs {
			ss = append(ss, res.stats())
		}
		cells = append(cells, r.statsRow(r.methodName(m), strconv.Itoa(len(rs)), medianStats(ss)))
	}
	if len(cells) == 0 {
		fmt.Fprintln(w, "no run finished")
		return
	}
	markdownTable(w, stormHeader(r.probe), cells)
	if r.o.verbose {
		r.printRuns(w, results)
	}
	printEstimates(w, results['f'])
	r.printWaits(w, results)
}

// printSettings writes what the runs ran on and with.
func (r *stormRun) printSettings(w io.Writer) {
	var u unix.Utsname
	unix.Uname(&u)
	o := r.o
	burst, rate := sizeString(o.burst)+" burst ("+sizeString(o.writeSize)+" write() calls, no fsync)", "throttled to "+sizeString(o.rate)+"/s (blkio, root cgroup)"
	if o.burst == 0 {
		burst = fmt.Sprintf("probe alone for %v (no burst)", o.minTime)
	}
	if o.rate == 0 {
		rate = "not throttled"
	}
	image := "allocated"
	if !o.allocated {
		image = "sparse"
	}
	fmt.Fprintf(w, "\nstorm: a %s on a %d MiB ext4 (%s image) on a direct-I/O loop device %s\n", burst, r.sizeMB, image, rate)
	fmt.Fprintf(w, "machine: Linux %s, %d cores, %.1f GiB RAM; %s\n", unix.ByteSliceToString(u.Release[:]), runtime.NumCPU(),
		float64(meminfoKB().total)/(1<<20), runtime.Version())
	fmt.Fprintf(w, "kernel settings (method k): vm.dirty_background_bytes=%s dirty_background_ratio=%s dirty_bytes=%s dirty_ratio=%s dirty_expire_centisecs=%s dirty_writeback_centisecs=%s\n",
		r.vm["dirty_background_bytes"], r.vm["dirty_background_ratio"], r.vm["dirty_bytes"], r.vm["dirty_ratio"], r.vm["dirty_expire_centisecs"], r.vm["dirty_writeback_centisecs"])
	if r.queue != "" {
		fmt.Fprintf(w, "loop device queue (as attached): %s\n", r.queue)
	}
	until := "until the burst file is clean"
	if o.minTime > 0 {
		until += fmt.Sprintf(" and at least %v from the burst's start", o.minTime)
	}
	fmt.Fprintf(w, "probe %s: %s, from %v before the burst %s; stalled = time in calls over %v\n",
		r.probe, r.probeWhat(), probeLead, until, stallOver)
	if slices.Contains(o.methods, 'f') {
		fmt.Fprintf(w, "f: flusherd %s with its defaults and: %s\n", flusherdVersion(o.bin), strings.Join(strings.Fields(o.fConfig), " "))
	}
}

// probeWhat says what the probe of the runs does.
func (r *stormRun) probeWhat() string {
	o := r.o
	switch r.probe {
	case probeSQLiteWAL, probeSQLiteRollback:
		mode := "WAL"
		if r.probe == probeSQLiteRollback {
			mode = "DELETE (rollback journal)"
		}
		return fmt.Sprintf("Python's sqlite3, journal_mode=%s, synchronous=FULL, one row inserted and committed, %v after each commit", mode, o.interval)
	case probePgbench:
		rate := fmt.Sprintf("-R %d", o.pgRate)
		if o.pgRate == 0 {
			rate = "as fast as it can (no -R)"
		}
		return fmt.Sprintf("PostgreSQL on the filesystem, pgbench -c 2 -j 2 %s, scale %d, latency from its per-transaction log", rate, o.pgScale)
	}
	return fmt.Sprintf("4 KiB pwrite at offset 0 + fdatasync, closed loop with %v between calls (pwrite+fdatasync)", o.interval)
}

// printRuns writes one row per run (--verbose), and each run's probe calls
// and longest pwrite.
func (r *stormRun) printRuns(w io.Writer, results map[byte][]*stormResult) {
	fmt.Fprintln(w, "\nper run:")
	var cells [][]string
	for _, m := range r.o.methods {
		for _, res := range results[m] {
			cells = append(cells, r.statsRow(r.methodName(m), fmt.Sprintf("run %d", res.run), res.stats()))
		}
	}
	markdownTable(w, stormHeader(r.probe), cells)
	fmt.Fprintln(w, "\nprobe calls, and the longest pwrite (ms), per run:")
	for _, m := range r.o.methods {
		for _, res := range results[m] {
			st := res.stats()
			fmt.Fprintf(w, "  %s run %d: %d calls, pwrite max %s ms\n", r.methodName(m), res.run, st.probes, fmtMs(st.pwriteMax))
		}
	}
}

// printEstimates writes, per run of method f, the error of flusherd's
// dirty-bytes estimate against cachestat.
func printEstimates(w io.Writer, fRuns []*stormResult) {
	for _, res := range fRuns {
		if len(res.ests) == 0 {
			continue
		}
		med, worst := estimateError(res.ests)
		fmt.Fprintf(w, "\nf run %d: flusherd's dirty bytes (stats file BdiReclaimable, rewritten at most once a second) against cachestat of the tree, %d samples every %v: median error %s MiB, largest %s MiB",
			res.run, len(res.ests), estimateEvery, mibOf(med), mibOf(worst))
	}
	if len(fRuns) > 0 {
		fmt.Fprintln(w)
	}
}

// printWaits writes, per method over all its runs, the four kernel stack
// tops the probe's threads were most often seen waiting in.
func (r *stormRun) printWaits(w io.Writer, results map[byte][]*stormResult) {
	if r.probe == probePgbench {
		fmt.Fprintln(w, "\nwhere the probe waited: not sampled (pgbench's commits wait in the server's processes)")
		return
	}
	fmt.Fprintf(w, "\nwhere the probe waited (kernel stack tops of its threads in D state, sampled every %v over all runs):\n", sampleEvery)
	for _, m := range r.o.methods {
		total := 0
		counts := map[string]int{}
		for _, res := range results[m] {
			total += res.waitSamples
			for k, v := range res.waits {
				counts[k] += v
			}
		}
		if len(results[m]) == 0 {
			continue
		}
		if total == 0 {
			fmt.Fprintf(w, "  %s: never seen in D state\n", r.methodName(m))
			continue
		}
		keys := make([]string, 0, len(counts))
		for k := range counts {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool {
			return counts[keys[i]] > counts[keys[j]] || counts[keys[i]] == counts[keys[j]] && keys[i] < keys[j]
		})
		fmt.Fprintf(w, "  %s: %d samples\n", r.methodName(m), total)
		for _, k := range keys[:min(len(keys), 4)] {
			fmt.Fprintf(w, "    %5.1f%%  %s\n", 100*float64(counts[k])/float64(total), k)
		}
	}
}

func sizeString(n int64) string {
	switch {
	case n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}

func flusherdVersion(bin string) string {
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(string(out)), "flusherd"))
}

// estimateError summarises flusherd's dirty-bytes estimate against the
// cachestat truth over the samples: the median and the largest absolute
// error, in bytes.
func estimateError(es []estSample) (median, worst uint64) {
	var errs []uint64
	for _, e := range es {
		d := e.est - e.truth
		if e.truth > e.est {
			d = e.truth - e.est
		}
		errs = append(errs, d)
		worst = max(worst, d)
	}
	return medianOf(errs), worst
}
