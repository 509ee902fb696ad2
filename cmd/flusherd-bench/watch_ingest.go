package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// ingestAndIdle runs the ingest phase, each placement and mode in turn,
// on one daemon, then the idle phase on a new one, on a tree of --files
// files.
func (r *watchRun) ingestAndIdle(ctx context.Context, backend string) error {
	dir, err := os.MkdirTemp(r.base, "ingest-"+backend+"-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	l, err := newBenchLoop(dir, r.o.fstype, 2048, 0)
	if err != nil {
		return err
	}
	defer closeFS(l, "watch")
	root := filepath.Join(l.Dir, "tree")
	r.progress("%s: creating %d files", backend, r.o.files)
	if err := createTree(ctx, root, r.o.files, 4096); err != nil {
		return err
	}
	if err := syncfs(l.Dir); err != nil {
		return err
	}
	if err := r.ingestAll(ctx, backend, filepath.Join(dir, "ingest"), root); err != nil {
		return err
	}
	// Idle: a new daemon on the same tree once it is clean.
	if err := syncfs(l.Dir); err != nil {
		return err
	}
	return r.idle(ctx, backend, filepath.Join(dir, "idle"), root)
}

// ingestAll starts a daemon with its files in dir and runs ingest for
// every placement and mode.
func (r *watchRun) ingestAll(ctx context.Context, backend, dir, root string) error {
	d, statsDir, err := r.startWatchDaemon(dir, backend, root)
	if err != nil {
		return err
	}
	defer d.kill()
	if err := sleepCtx(ctx, settle); err != nil {
		return err
	}
	// "shared" first: once moved into its own cgroup, the daemon stays
	// there.
	for _, place := range r.o.placements {
		for _, mode := range r.o.modes {
			// Every tracked file written back: none is quiet (see the
			// package comment).
			if out, err := exec.CommandContext(ctx, r.o.bin, "sync", "--stats-dir", statsDir, "--timeout", "60s").CombinedOutput(); err != nil {
				return fmt.Errorf("flusherd sync before ingest %s (%s): %v: %s", mode, place, err, out)
			}
			if err := r.ingest(ctx, backend, mode, place, d, statsDir, root); err != nil {
				if ctx.Err() != nil {
					return err
				}
				return fmt.Errorf("ingest %s (%s): %w (daemon log:\n%s)", mode, place, err, tail(d.logText(), 20))
			}
		}
	}
	if ws, ok := readWatchStats(statsDir); ok && ws.Backend != "" {
		r.t.set(0, "backend in use (daemon's watch/stats)", "", backend, ws.Backend)
	} else {
		r.t.set(0, "backend in use (daemon's watch/stats)", "", backend, "n/a")
	}
	d.kill()
	return nil
}

// idle starts a daemon with its files in dir and, after the settle,
// measures its wakeups and CPU over --idle.
func (r *watchRun) idle(ctx context.Context, backend, dir, root string) error {
	d, _, err := r.startWatchDaemon(dir, backend, root)
	if err != nil {
		return err
	}
	defer d.kill()
	r.progress("%s: idle, %v after a %v settle", backend, r.o.idle, settle)
	if err := sleepCtx(ctx, settle); err != nil {
		return err
	}
	cpu0, sw0, t0 := d.cpu(), d.switches(), time.Now()
	if err := sleepCtx(ctx, r.o.idle); err != nil {
		return err
	}
	cpu1, sw1, t1 := d.cpu(), d.switches(), time.Now()
	el := t1.Sub(t0).Seconds()
	rate := (float64(sw1) - float64(sw0)) / el
	idleName := fmt.Sprintf("idle (%d clean files, %v): ", r.o.files, r.o.idle.Round(time.Second))
	r.t.set(3, idleName+"wakeups/s (context switches, all threads)", "0", backend,
		fmt.Sprintf("%.2f %s", rate, metIf(rate == 0)))
	r.t.set(3, idleName+"daemon CPU", "", backend, fmt.Sprintf("%.2f s", (cpu1-cpu0).Seconds()))
	return nil
}

// ingest runs the writers in one mode and placement against the running
// daemon d and records its rows.
func (r *watchRun) ingest(ctx context.Context, backend, mode, place string, d *daemon, statsDir, root string) error {
	r.progress("%s: ingest %s, %d writers, %d files, %v, placement %s", backend, mode, r.o.writers, r.o.files, r.o.duration, place)
	wg, err := r.place(place, d)
	if err != nil {
		return err
	}
	ws, err := startWriters(ctx, r.o, root, mode, wg)
	if err != nil {
		return err
	}
	defer ws.kill()
	st0, hasEv := readWatchStats(statsDir)
	ovLog0 := countOverflowLines(d.logText())
	cpu0, t0 := d.cpu(), time.Now()
	if err := ws.start(); err != nil {
		return err
	}
	writes, rate, err := ws.wait(ctx, r.o.duration+30*time.Second)
	if err != nil {
		return err
	}
	tw := time.Now()
	// The daemon may still be reading a backlog: wait until it is idle.
	tEnd, quiet := waitQuiet(ctx, d, 120*time.Second)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	cpu1 := d.cpu()
	st1, hasEv1 := readWatchStats(statsDir)
	hasEv = hasEv && hasEv1
	el := tEnd.Sub(t0).Seconds()
	cpu := (cpu1 - cpu0).Seconds()
	ev := eventCellsOf(st0, st1, hasEv, writes, cpu, el)
	busy := fmt.Sprintf("%.1f s", tEnd.Sub(tw).Seconds())
	if !quiet {
		busy = fmt.Sprintf("still busy after %.0f s", tEnd.Sub(tw).Seconds())
	}
	trackedCell, err := r.trackedCell(ctx, statsDir)
	if err != nil {
		return err
	}
	name := func(s string) string { return fmt.Sprintf("ingest %s: %s", mode, s) }
	if place == "service" {
		name = func(s string) string { return fmt.Sprintf("ingest %s, own cgroups: %s", mode, s) }
	}
	for _, c := range [][3]string{
		{fmt.Sprintf("writes issued/s (%d procs, %s files)", r.o.writers, thousands(uint64(r.o.files))), "", thousands(uint64(rate))},
		{"events absorbed/s (daemon's events counter)", "", ev.rate},
		{"events absorbed per write issued", "", ev.perWrite},
		{"daemon CPU s (cores used)", "", fmt.Sprintf("%.2f (%.2f)", cpu, cpu/el)},
		{"daemon CPU s per million events", "", ev.cpuPerMEv},
		{"daemon CPU s per million writes", "", fmt.Sprintf("%.2f", cpu/(float64(writes)/1e6))},
		{"events/s per core used", "≥ 100,000", ev.perCore},
		{"queue overflows / rescans", "", overflowCell(st0, st1, hasEv, countOverflowLines(d.logText())-ovLog0)},
		{"files quieted (ignore marks on files written continually)", "", quietedCell(st0, st1, hasEv)},
		{"daemon still busy after the writers stopped", "", busy},
		{"files tracked at the end", "", trackedCell},
	} {
		r.t.set(1, name(c[0]), c[1], backend, c[2])
	}
	return nil
}

// place puts the daemon d in its cgroup for placement "service" and
// returns the writers' cgroup (nil for "shared").
func (r *watchRun) place(place string, d *daemon) (*cpuGroup, error) {
	if place != "service" {
		return nil, nil
	}
	pid := d.cmd.Process.Pid
	if err := r.daemonGroup.add(pid); err != nil {
		return nil, fmt.Errorf("moving the daemon into %s: %w", r.daemonGroup.dir, err)
	}
	if in, all, err := r.daemonGroup.threadsIn(pid); err != nil || in != all || all == 0 {
		return nil, fmt.Errorf("the daemon's threads in %s: %d of %d (%v)", r.daemonGroup.dir, in, all, err)
	}
	return r.writerGroup, nil
}

// eventCells are the ingest cells made from the daemon's events counter
// ("n/a" without one).
type eventCells struct {
	rate, perWrite, cpuPerMEv, perCore string
}

// eventCellsOf computes the event cells from the watch/stats before and
// after, the writes issued, the daemon's CPU seconds and the elapsed
// seconds.
func eventCellsOf(st0, st1 watchStats, hasEv bool, writes uint64, cpu, el float64) eventCells {
	c := eventCells{"n/a", "n/a", "n/a", "n/a (no watch/stats)"}
	if !hasEv {
		return c
	}
	ev, _ := st1.get("events")
	e0, _ := st0.get("events")
	events := float64(ev - e0)
	c.rate = thousands(uint64(events / el))
	c.perWrite = fmt.Sprintf("%.3f", events/float64(writes))
	c.perCore = "n/a"
	if events > 0 && cpu > 0 {
		c.cpuPerMEv = fmt.Sprintf("%.2f", cpu/(events/1e6))
		// events/s divided by the cores used (CPU s / wall s).
		pc := events / cpu
		c.perCore = fmt.Sprintf("%s %s", thousands(uint64(pc)), metIf(pc >= 100000))
	}
	return c
}

// trackedCell is "N of FILES", the files the daemon tracks, read until it
// is all of --files or for 7 s; "n/a" without a stats file.
func (r *watchRun) trackedCell(ctx context.Context, statsDir string) (string, error) {
	// The device's stats file is rewritten when its writeback goroutine
	// runs: with nothing expired, once a dirty_writeback_interval (5s).
	cell := "n/a"
	for wait := time.Now().Add(7 * time.Second); ; {
		n, ok := tracked(statsDir)
		if ok {
			cell = fmt.Sprintf("%s of %s", thousands(n), thousands(uint64(r.o.files)))
		}
		if n >= uint64(r.o.files) || time.Now().After(wait) {
			return cell, nil
		}
		if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
			return "", err
		}
	}
}

// quietedCell is the growth of watch/stats' quieted count ("n/a" for a
// daemon that has none).
func quietedCell(st0, st1 watchStats, has bool) string {
	q1, ok := st1.get("quieted")
	if !has || !ok {
		return "n/a"
	}
	q0, _ := st0.get("quieted")
	return thousands(q1 - q0)
}

func overflowCell(st0, st1 watchStats, has bool, logged int) string {
	ov, rs := "n/a", "n/a"
	if has {
		if a, ok := st1.get("overflows"); ok {
			b, _ := st0.get("overflows")
			ov = thousands(a - b)
		}
		if a, ok := st1.get("rescans"); ok {
			b, _ := st0.get("rescans")
			rs = thousands(a - b)
		}
	}
	if ov == "n/a" {
		ov = fmt.Sprintf("%d (log)", logged)
	}
	return ov + " / " + rs
}

// countOverflowLines counts the daemon's log lines about an overflowed
// event queue (a fallback when the watch/stats file is not there).
func countOverflowLines(log string) int {
	n := 0
	for line := range strings.Lines(log) {
		if strings.Contains(strings.ToLower(line), "overflow") {
			n++
		}
	}
	return n
}

// waitQuiet waits until the daemon has used no more than one clock tick of
// CPU for a whole second, and returns when it was last busy (and false if
// it was still busy at the limit).
func waitQuiet(ctx context.Context, d *daemon, limit time.Duration) (time.Time, bool) {
	const tick = 10 * time.Millisecond // USER_HZ
	start := time.Now()
	last, lastCPU := start, d.cpu()
	quietFrom, quietCPU := start, lastCPU
	for {
		if sleepCtx(ctx, 100*time.Millisecond) != nil {
			return last, false
		}
		now, c := time.Now(), d.cpu()
		if c-lastCPU > 0 {
			last = now
		}
		lastCPU = c
		if c-quietCPU > tick {
			quietFrom, quietCPU = now, c
		}
		if now.Sub(quietFrom) >= time.Second {
			// The last CPU tick within the quiet second is noise (GC,
			// sysmon); the busy period ended at quietFrom.
			return quietFrom, true
		}
		if now.Sub(start) > limit {
			return last, false
		}
	}
}
