package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Internal commands of sweep: a process that opens and closes files, and
// one that holds files mapped.
const (
	sweepOpenerCmd = "sweep-opener"
	sweepHolderCmd = "sweep-holder"
)

// sweepBench measures what the sweep of files dirtied without an event
// (watcher.sweep_interval) costs the daemon, with each backend on a loop
// ext4:
//
//	(a) open events: the daemon's CPU per 100,000 read-only opens (and
//	    closes) by another process, of a file inside the tree and of one
//	    outside it on the same filesystem, with sweep_interval = "0" (no
//	    open events asked for) and "auto";
//	(b) the sweep: 1,000 candidates (files mapped shared, clean) held by
//	    100 processes; the daemon's CPU per second over --hold, for each
//	    --intervals value (and "0", the baseline), and per look;
//	(c) the daemon's own opens: its CPU from its start to the end of the
//	    initial scan of --scan-files clean files (one open each, whose
//	    events inotify reports as any other's), sweep_interval "0" and
//	    "auto".
func sweepBench(args []string) int {
	fl := newFlags("sweep", "the cost of the sweep of files dirtied without an event: the daemon's CPU per 100,000 opens inside and outside the tree (open events asked for or not), and per second with 1,000 candidates held by 100 processes.", "go run ./cmd/flusherd-bench sweep")
	bin := fl.String("flusherd", "", "flusherd binary (default: go build ./cmd/flusherd into a temporary directory)")
	opens := fl.Int("opens", 100000, "opens per phase of (a)")
	procs := fl.Int("procs", 100, "holder processes in (b)")
	perProc := fl.Int("files", 10, "files each holder maps in (b)")
	hold := fl.Duration("hold", 10*time.Second, "length of each measure of (b)")
	intervals := fl.String("intervals", "100ms,500ms,1s", "sweep_interval values of (b)")
	backends := fl.String("backends", "fanotify,inotify", "watch backends, comma-separated")
	scanFiles := fl.Int("scan-files", 40000, "clean files in the tree at the start, for (c)")
	if code, ok := parseFlags(fl, args); !ok {
		return code
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "flusherd-bench sweep: needs root (loop devices, fanotify)")
		return 1
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "flusherd-bench sweep:", err)
		return 1
	}
	base, err := os.MkdirTemp("", "flusherd-bench-sweep-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "flusherd-bench sweep:", err)
		return 1
	}
	defer os.RemoveAll(base)
	if *bin == "" {
		if *bin, err = buildFlusherd(base); err != nil {
			fmt.Fprintln(os.Stderr, "flusherd-bench sweep:", err)
			return 1
		}
	}
	fs, err := newBenchLoop(base, "ext4", 512, *scanFiles+20000)
	if err != nil {
		fmt.Fprintln(os.Stderr, "flusherd-bench sweep:", err)
		return 1
	}
	defer closeFS(fs, "sweep")
	tree, outside := filepath.Join(fs.Dir, "tree"), filepath.Join(fs.Dir, "outside")
	for _, d := range []string{tree, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, "flusherd-bench sweep:", err)
			return 1
		}
	}
	in, out := filepath.Join(tree, "o"), filepath.Join(outside, "o")
	for _, dir := range []string{in, out} {
		if err := makeFiles(dir, openedFiles); err != nil {
			fmt.Fprintln(os.Stderr, "flusherd-bench sweep:", err)
			return 1
		}
	}
	if err := syncfs(fs.Dir); err != nil {
		fmt.Fprintln(os.Stderr, "flusherd-bench sweep:", err)
		return 1
	}
	configFor := func(backend, sweep, root string) string {
		return fmt.Sprintf("[writeback]\ndirty_writeback_interval = \"1s\"\n[watcher]\nbackend = %q\nsweep_interval = %q\n[[watch]]\npath = %q\nexpire = \"2s\"\n", backend, sweep, root)
	}
	bes := splitList(*backends)
	fmt.Printf("(a) the daemon's CPU per %s read-only opens and closes by another process, of %s files in turn (ext4)\n\n", thousands(uint64(*opens)), thousands(openedFiles))
	var rows [][]string
	for _, be := range bes {
		for _, sweep := range []string{"0", "auto"} {
			row := []string{be, sweep}
			for _, p := range []string{in, out} {
				cpu, err := openCost(*bin, base, configFor(be, sweep, tree), self, p, *opens)
				if err != nil {
					fmt.Fprintln(os.Stderr, "flusherd-bench sweep:", err)
					return 1
				}
				row = append(row, fmt.Sprintf("%.0f ms", float64(cpu)/float64(time.Millisecond)))
			}
			rows = append(rows, row)
		}
	}
	markdownTable(os.Stdout, []string{"backend", "sweep_interval", "files inside the tree", "files outside the tree"}, rows)

	n := *procs * *perProc
	fmt.Printf("\n(b) the daemon's CPU with %s candidates (clean files mapped shared) held by %d processes, over %v\n\n", thousands(uint64(n)), *procs, *hold)
	var files []string
	for i := range n {
		p := filepath.Join(tree, fmt.Sprintf("m%04d", i))
		if err := os.WriteFile(p, make([]byte, 64<<10), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "flusherd-bench sweep:", err)
			return 1
		}
		files = append(files, p)
	}
	if err := syncfs(fs.Dir); err != nil {
		fmt.Fprintln(os.Stderr, "flusherd-bench sweep:", err)
		return 1
	}
	rows = nil
	for _, be := range bes {
		for _, sweep := range append([]string{"0"}, splitList(*intervals)...) {
			cpuRate, cands, err := sweepCost(*bin, base, configFor(be, sweep, tree), self, files, *procs, *hold)
			if err != nil {
				fmt.Fprintln(os.Stderr, "flusherd-bench sweep:", err)
				return 1
			}
			perLook := "-"
			if d, err := time.ParseDuration(sweep); err == nil && d > 0 && cands > 0 {
				looks := float64(cands) * float64(time.Second) / float64(d)
				perLook = fmt.Sprintf("%.1f µs", float64(cpuRate)/looks/float64(time.Microsecond))
			}
			rows = append(rows, []string{be, sweep, strconv.Itoa(cands), fmt.Sprintf("%.1f ms", float64(cpuRate)/float64(time.Millisecond)),
				fmt.Sprintf("%.2f %%", float64(cpuRate)/float64(time.Second)*100), perLook})
		}
	}
	markdownTable(os.Stdout, []string{"backend", "sweep_interval", "sweep_candidates", "CPU per second", "of one core", "per candidate look"}, rows)

	fmt.Printf("\n(c) the daemon's CPU from its start to the end of its initial scan of %s clean files (and until its CPU settles), and sweep_candidates then\n\n", thousands(uint64(*scanFiles)))
	scanTree := filepath.Join(fs.Dir, "scan")
	if err := os.Mkdir(scanTree, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "flusherd-bench sweep:", err)
		return 1
	}
	for d := 0; d*1000 < *scanFiles; d++ {
		if err := makeFiles(filepath.Join(scanTree, fmt.Sprintf("d%03d", d)), min(1000, *scanFiles-d*1000)); err != nil {
			fmt.Fprintln(os.Stderr, "flusherd-bench sweep:", err)
			return 1
		}
	}
	if err := syncfs(fs.Dir); err != nil {
		fmt.Fprintln(os.Stderr, "flusherd-bench sweep:", err)
		return 1
	}
	rows = nil
	for _, be := range bes {
		for _, sweep := range []string{"0", "auto"} {
			cpu, cands, err := scanCost(*bin, base, configFor(be, sweep, scanTree))
			if err != nil {
				fmt.Fprintln(os.Stderr, "flusherd-bench sweep:", err)
				return 1
			}
			rows = append(rows, []string{be, sweep, fmt.Sprintf("%.0f ms", float64(cpu)/float64(time.Millisecond)), strconv.Itoa(cands)})
		}
	}
	markdownTable(os.Stdout, []string{"backend", "sweep_interval", "CPU to the scan's end", "sweep_candidates"}, rows)
	return 0
}

// scanCost starts the daemon with cfg and returns its CPU time once its
// initial scan is done and its CPU has settled, and its sweep_candidates
// then.
func scanCost(bin, base, cfg string) (time.Duration, int, error) {
	dir, err := os.MkdirTemp(base, "d")
	if err != nil {
		return 0, 0, err
	}
	d, err := startDaemon(bin, dir, cfg)
	if err != nil {
		return 0, 0, err
	}
	defer d.stop()
	settleCPU(d)
	time.Sleep(time.Second) // a stats file written since
	return d.cpu(), candidates(filepath.Join(dir, "run", "bdi")), nil
}

// openedFiles is how many files (a) opens in turn, in each directory: one
// file opened again and again would have most of its events merged while
// queued.
const openedFiles = 1000

// makeFiles makes dir with n files of 4 KiB, o0000 and on.
func makeFiles(dir string, n int) error {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	for i := range n {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("o%04d", i)), make([]byte, 4096), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// openCost runs the daemon with cfg, then a process that opens and closes
// the files of dir in turn, n opens in all, and returns the daemon's CPU time from the start of the
// opens until its queue has been read (the CPU still growing, waited for).
func openCost(bin, base, cfg, self, path string, n int) (time.Duration, error) {
	dir, err := os.MkdirTemp(base, "d")
	if err != nil {
		return 0, err
	}
	d, err := startDaemon(bin, dir, cfg)
	if err != nil {
		return 0, err
	}
	defer d.stop()
	time.Sleep(500 * time.Millisecond)
	before := d.cpu()
	if out, err := exec.Command(self, sweepOpenerCmd, path, strconv.Itoa(n)).CombinedOutput(); err != nil {
		return 0, fmt.Errorf("opener: %v: %s", err, out)
	}
	settleCPU(d)
	return d.cpu() - before, nil
}

// settleCPU waits until the daemon's CPU time stops growing (for 300 ms).
func settleCPU(d *daemon) {
	last := d.cpu()
	for range 50 {
		time.Sleep(300 * time.Millisecond)
		now := d.cpu()
		if now == last {
			return
		}
		last = now
	}
}

// sweepCost runs the daemon with cfg and procs processes that map files
// (split between them), and returns the daemon's CPU per second over hold
// once they all hold their files, with its sweep_candidates then.
func sweepCost(bin, base, cfg, self string, files []string, procs int, hold time.Duration) (time.Duration, int, error) {
	dir, err := os.MkdirTemp(base, "d")
	if err != nil {
		return 0, 0, err
	}
	d, err := startDaemon(bin, dir, cfg)
	if err != nil {
		return 0, 0, err
	}
	defer d.stop()
	per := len(files) / procs
	var holders []*exec.Cmd
	defer func() {
		for _, h := range holders {
			h.Process.Kill()
			h.Wait()
		}
	}()
	for i := range procs {
		h := exec.Command(self, append([]string{sweepHolderCmd}, files[i*per:(i+1)*per]...)...)
		out, err := h.StdoutPipe()
		if err != nil {
			return 0, 0, err
		}
		if err := h.Start(); err != nil {
			return 0, 0, err
		}
		holders = append(holders, h)
		if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || strings.TrimSpace(line) != "held" {
			return 0, 0, fmt.Errorf("holder: %q, %v", line, err)
		}
	}
	settleCPU(d)
	before, start := d.cpu(), time.Now()
	time.Sleep(hold)
	cpu, took := d.cpu()-before, time.Since(start)
	cands := candidates(filepath.Join(dir, "run", "bdi"))
	return time.Duration(float64(cpu) * float64(time.Second) / float64(took)), cands, nil
}

// candidates sums sweep_candidates over the devices' stats files under
// dir.
func candidates(dir string) int {
	ents, _ := os.ReadDir(dir)
	n := 0
	for _, e := range ents {
		data, err := os.ReadFile(filepath.Join(dir, e.Name(), "stats"))
		if err != nil {
			continue
		}
		if v, ok := parseKV(data)["sweep_candidates"]; ok {
			k, _ := strconv.Atoi(v)
			n += k
		}
	}
	return n
}

// sweepOpener opens (read-only) and closes the files of makeFiles in
// directory args[0] in turn, args[1] opens in all.
func sweepOpener(args []string) int {
	n, _ := strconv.Atoi(args[1])
	names := make([]string, openedFiles)
	for i := range names {
		names[i] = filepath.Join(args[0], fmt.Sprintf("o%04d", i))
	}
	for i := range n {
		fd, err := unix.Open(names[i%len(names)], unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		unix.Close(fd)
	}
	return 0
}

// sweepHolder maps each file of args shared, read-write, closes its
// descriptor, prints "held" and waits to be killed.
func sweepHolder(args []string) int {
	for _, p := range args {
		fd, err := unix.Open(p, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if _, err := unix.Mmap(fd, 0, 64<<10, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		unix.Close(fd)
	}
	fmt.Println("held")
	for {
		unix.Pause()
	}
}
