// Command flusherd-bench runs flusherd's experiments and benchmarks against
// the real daemon binary and prints their results as tables. It needs root
// (it mounts FUSE and loop filesystems).
//
//	flusherd-bench blocked [--flusherd BIN] [--phases abc]
//
// blocked compares requeue_blocked = "io_wait" with "redirty_tail", side by
// side in one run, on FUSE filesystems whose opens fail or stall on demand
// (internal/faultfs):
//
//	(a) unblock latency: 50 files whose opens fail with EAGAIN (--a-error) for 20s;
//	    the time from unblock until cachestat shows each clean.
//	(b) starvation: a file appended every 20ms for 60s whose every
//	    writeback attempt sees a redirty (its open takes 30ms); the longest
//	    time any byte stayed dirty.
//	(c) no busy loop: 1,000 files blocked for 60s (--c-error: their opens
//	    fail with ENOTCONN, a dead FUSE server, or EAGAIN); the daemon's context
//	    switches per second once the pause has saturated, and its CPU time.
//
//	flusherd-bench plug [--fs ext4,xfs] [--small N] [--large N] [--runs N]
//	flusherd-bench watch [--backends inotify,fanotify] [--inodes 100000,1000000] [--idle 60s] ...
//
// watch measures the daemon's cost of watching (watch.go): event ingest
// rate and CPU, RSS per tracked inode, and idle wakeups.
//
//	flusherd-bench sweep [--opens 100000] [--procs 100] [--files 10] [--hold 10s] [--intervals 100ms,500ms,1s]
//
// sweep measures the cost of the sweep of files dirtied without an event
// (sweep.go): the daemon's CPU per 100,000 opens inside and outside the
// tree, with and without open events, and per second with 1,000
// candidates held by 100 processes.
//
//	flusherd-bench storm [--burst 1GiB] [--rate 41943040] [--runs 3] [--methods ktfw] [--png storm.png] ...
//
//	flusherd-bench trees [--counts 10,1000,10000] [--backends fanotify,inotify] [--base BIN] ...
//
// trees measures the costs by the number of trees (trees.go): time to
// READY, CPU per directory made and removed outside the trees, CPU per
// written file.
//
// storm measures a writeback storm on a slow disk (storm.go): a burst
// written without fsync to a loop device throttled to disk speed, and the
// fdatasync latency of a small probe beside it, under the kernel's
// defaults (k), a lower vm.dirty_background_bytes (t), a wbt latency
// target (w) and flusherd (f).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" {
		out := os.Stdout // asked for: on standard output, as --help of a command
		if len(os.Args) < 2 {
			out = os.Stderr
		}
		fmt.Fprint(out, "Usage:\n  flusherd-bench blocked [--flusherd BIN] [--phases abc]\n  flusherd-bench plug [--fs ext4,xfs] [--small N] [--large N] [--runs N] [--methods abcdei] [--queue-depth 8] [--cpuprofile FILE]\n  flusherd-bench watch [--backends inotify,fanotify] [--inodes 100000,1000000] [--idle 60s] [--writers 8] [--files 10000] [--duration 10s] [--fs ext4] [--modes pwrite,reopen] [--placement shared,service] [--range-bytes 1MiB]\n  flusherd-bench storm [--burst 1GiB] [--rate 41943040] [--runs 3] [--methods ktfw] [--max-wait 180s] [--wbt-lat 75000] [--f-config TOML] [--flusherd BIN] [--png storm.png] [--fs-mib N] [--probe fdatasync,sqlite,pgbench] [--min-time D] [--verbose]\n  flusherd-bench sweep [--flusherd BIN] [--opens 100000] [--procs 100] [--files 10] [--hold 10s] [--intervals 100ms,500ms,1s]\n  flusherd-bench trees [--counts 10,1000,10000] [--backends fanotify,inotify] [--churn 2000] [--files 1000] [--flusherd BIN] [--base BIN] [--timeout 5m]\n  flusherd-bench membudget [--files 250000,500000,1000000] [--backends fanotify,inotify] [--limit-mib 160] [--max-tracked auto] [--flusherd BIN]\n\nblocked: the blocked-files experiment (io_wait beside redirty_tail).\nplug: time to clean a tree of dirty files with flusherd (plug on, off, integrity) against a per-file fdatasync loop and syncfs.\nwatch: the daemon's cost of watching: event ingest rate and CPU, RSS per tracked inode, idle wakeups.\nstorm: a writeback storm on a throttled loop device: a small fdatasync probe's latency and the burst's time to clean, kernel defaults against tuned sysctls, wbt and flusherd.\nsweep: the cost of the sweep of files dirtied without an event: CPU per 100,000 opens, and per second with 1,000 candidates.\ntrees: the costs by the number of trees: time to READY, CPU per directory change outside the trees, CPU per written file.\nmembudget: the daemon under a memory cgroup limit with many small dirty files: its peak memory, OOM kills and the time until every file is clean.\nAll need root and print tables. flusherd-bench COMMAND --help lists a command's flags.\n")
		if len(os.Args) < 2 {
			os.Exit(2)
		}
		os.Exit(0)
	}
	switch os.Args[1] {
	case "blocked":
		os.Exit(blocked(os.Args[2:]))
	case "plug":
		os.Exit(plugBench(os.Args[2:]))
	case "watch":
		os.Exit(watchBench(os.Args[2:]))
	case watchWriterCmd: // internal: one writer process of watch
		os.Exit(watchWriter(os.Args[2:]))
	case "storm":
		os.Exit(stormBench(os.Args[2:]))
	case "sweep":
		os.Exit(sweepBench(os.Args[2:]))
	case sweepOpenerCmd: // internal: sweep's opener
		os.Exit(sweepOpener(os.Args[2:]))
	case sweepHolderCmd: // internal: sweep's holder of mapped files
		os.Exit(sweepHolder(os.Args[2:]))
	case "trees":
		os.Exit(treesBench(os.Args[2:]))
	case "membudget":
		os.Exit(memBudget(os.Args[2:]))
	case stormWriterCmd: // internal: storm's bulk writer
		os.Exit(stormWriter(os.Args[2:]))
	case stormProbeCmd: // internal: storm's latency probe
		os.Exit(stormProbe(os.Args[2:]))
	}
	fmt.Fprintf(os.Stderr, "flusherd-bench: unknown command %q\n", os.Args[1])
	os.Exit(2)
}

// letters checks a flag of one-letter choices (--methods, --phases):
// each letter one of allowed, at most once, and at least one.
func letters(flagName, value, allowed string) error {
	if value == "" {
		return fmt.Errorf("--%s is empty: want some of %s", flagName, allowed)
	}
	for i, c := range value {
		if !strings.ContainsRune(allowed, c) || strings.ContainsRune(value[:i], c) {
			return fmt.Errorf("--%s %q: each of %s at most once", flagName, value, allowed)
		}
	}
	return nil
}

// needMkfs checks that mkfs.<type> is installed for every filesystem
// type, before a bench spends minutes on the first one.
func needMkfs(fstypes []string) error {
	for _, t := range fstypes {
		if _, err := exec.LookPath("mkfs." + t); err != nil {
			return fmt.Errorf("--fs %s needs mkfs.%s (e2fsprogs for ext4, xfsprogs for xfs): %w", t, t, err)
		}
	}
	return nil
}

// newFlags is a command's flag set, whose --help says what the command
// does and gives an example before the flags.
func newFlags(name, summary, example string) *flag.FlagSet {
	fl := flag.NewFlagSet(name, flag.ContinueOnError)
	fl.Usage = func() {
		fmt.Fprintf(fl.Output(), "Usage: flusherd-bench %s [flags]\n\n%s\nNeeds root; prints a table.\n\nExample:\n  %s\n\nFlags:\n", name, summary, example)
		fl.PrintDefaults()
	}
	return fl
}

// parseFlags parses args into fl. It reports false, with the exit code,
// when the command is not to run: 0 after --help, 2 after a bad flag
// (flag has printed why and the usage).
func parseFlags(fl *flag.FlagSet, args []string) (code int, ok bool) {
	if err := fl.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, false
		}
		return 2, false
	}
	return 0, true
}

// buildFlusherd builds cmd/flusherd into dir.
func buildFlusherd(dir string) (string, error) {
	bin := filepath.Join(dir, "flusherd")
	out, err := exec.Command("go", "build", "-o", bin, "./cmd/flusherd").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build ./cmd/flusherd (run from the repository root): %v\n%s", err, out)
	}
	return bin, nil
}

// markdownTable writes a Markdown table, its columns aligned by
// text/tabwriter.
func markdownTable(w io.Writer, header []string, rows [][]string) {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	line := func(cells []string) {
		for _, c := range cells {
			fmt.Fprintf(tw, "| %s\t", c)
		}
		fmt.Fprintln(tw, "|")
	}
	line(header)
	sep := make([]string, len(header))
	for i := range sep {
		sep[i] = "---"
	}
	line(sep)
	for _, r := range rows {
		line(r)
	}
	tw.Flush()
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// sleepCtx sleeps for d, or until ctx is done (then its error).
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
