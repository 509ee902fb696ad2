package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

type stormChild struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	exited chan struct{}
	err    error
}

var errChildSlow = errors.New("no answer in time")

// startStormChild re-executes this binary as a hidden command, in its own
// process group (a Ctrl-C is the bench's to handle) and killed if the
// bench dies.
func startStormChild(self string, args ...string) (*stormChild, error) {
	cmd := exec.Command(self, args...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &stormChild{cmd: cmd, stdin: in, lines: make(chan string, 4096), exited: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		c.err = cmd.Wait()
		close(c.lines)
		close(c.exited)
	}()
	return c, nil
}

// wait waits for the child to exit and returns its status.
func (c *stormChild) wait() error {
	<-c.exited
	return c.err
}

func (c *stormChild) expect(ctx context.Context, want string, limit time.Duration) error {
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case l, ok := <-c.lines:
		if !ok {
			return fmt.Errorf("%s exited: %v", filepath.Base(c.cmd.Args[1]), c.wait())
		}
		if l != want {
			return fmt.Errorf("%s: %q, want %q", c.cmd.Args[1], l, want)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return fmt.Errorf("%s: %w", c.cmd.Args[1], errChildSlow)
	}
}

// collect reads the probe's records up to its "end" line.
func (c *stormChild) collect(ctx context.Context, limit time.Duration) ([]probeRec, error) {
	t := time.NewTimer(limit)
	defer t.Stop()
	var recs []probeRec
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				return nil, fmt.Errorf("exited before its end line: %v", c.wait())
			}
			if l == "end" {
				return recs, nil
			}
			p, err := parseProbeLine(l)
			if err != nil {
				return nil, err
			}
			recs = append(recs, p)
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
			return nil, errChildSlow
		}
	}
}

func parseProbeLine(l string) (probeRec, error) {
	f := strings.Fields(l)
	if len(f) != 4 || f[0] != "p" {
		return probeRec{}, fmt.Errorf("probe: bad line %q", l)
	}
	var v [3]int64
	for i := range v {
		n, err := strconv.ParseInt(f[i+1], 10, 64)
		if err != nil {
			return probeRec{}, fmt.Errorf("probe: bad line %q", l)
		}
		v[i] = n
	}
	return probeRec{at: v[0], pwrite: time.Duration(v[1]), sync: time.Duration(v[2])}, nil
}

// kill kills the child if it still runs and waits for it.
func (c *stormChild) kill() {
	select {
	case <-c.exited:
		return
	default:
	}
	c.cmd.Process.Kill()
	go func() {
		for range c.lines {
		}
	}()
	<-c.exited
}

// stormWriter is the bulk writer: it creates --file, says "ready", waits
// for a line on stdin, writes --bytes in --size write(2) calls, closes the
// file (no fsync), and prints "w START NS" per call and "done FIRST END"
// (CLOCK_MONOTONIC ns).
func stormWriter(args []string) int {
	fl := flag.NewFlagSet(stormWriterCmd, flag.ContinueOnError)
	path := fl.String("file", "", "file to create")
	total := fl.Int64("bytes", 0, "bytes to write")
	size := fl.Int64("size", writeChunk, "bytes per write(2)")
	if err := fl.Parse(args); err != nil || *path == "" || *total <= 0 || *size <= 0 {
		return 2
	}
	debug.SetGCPercent(-1)
	fd, err := unix.Open(*path, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o644)
	if err != nil {
		fmt.Fprintf(os.Stderr, "storm-writer: %s: %v\n", *path, err)
		return 1
	}
	buf := make([]byte, *size)
	for i := range buf {
		buf[i] = byte(i*31 + 7)
	}
	n := int(*total / *size) + 1
	starts, lats := make([]int64, 0, n), make([]int64, 0, n)
	fmt.Println("ready")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return 1
	}
	first := monoNow()
	for done := int64(0); done < *total; {
		t0 := monoNow()
		k, err := unix.Write(fd, buf[:min(int64(len(buf)), *total-done)])
		t1 := monoNow()
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "storm-writer: write %s: %v\n", *path, err)
			return 1
		}
		starts, lats = append(starts, t0), append(lats, t1-t0)
		done += int64(k)
	}
	end := monoNow()
	unix.Close(fd)
	out := bufio.NewWriter(os.Stdout)
	for i := range starts {
		fmt.Fprintf(out, "w %d %d\n", starts[i], lats[i])
	}
	fmt.Fprintf(out, "done %d %d\n", first, end)
	if out.Flush() != nil {
		return 1
	}
	return 0
}

// stormProbe is the latency probe: a 4 KiB pwrite at offset 0 of --file
// and an fdatasync, then a pause of --interval, until a line (or EOF) on
// stdin; "ready" after the first call, then "p START PWRITE_NS
// FDATASYNC_NS" per call (CLOCK_MONOTONIC) and "end".
func stormProbe(args []string) int {
	fl := flag.NewFlagSet(stormProbeCmd, flag.ContinueOnError)
	path := fl.String("file", "", "probe file")
	interval := fl.Duration("interval", 10*time.Millisecond, "pause between calls")
	if err := fl.Parse(args); err != nil || *path == "" {
		return 2
	}
	debug.SetGCPercent(-1)
	fd, err := unix.Open(*path, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		fmt.Fprintf(os.Stderr, "storm-probe: %s: %v\n", *path, err)
		return 1
	}
	defer unix.Close(fd)
	var stop atomic.Bool
	go func() {
		bufio.NewReader(os.Stdin).ReadString('\n')
		stop.Store(true)
	}()
	buf := bytes.Repeat([]byte{'q'}, probeSize)
	recs := make([]probeRec, 0, 1<<16)
	for i := 0; !stop.Load(); i++ {
		buf[0] = byte(i)
		t0 := monoNow()
		_, err := unix.Pwrite(fd, buf, 0)
		t1 := monoNow()
		if err == nil {
			err = unix.Fdatasync(fd)
		}
		t2 := monoNow()
		if err != nil && err != unix.EINTR {
			fmt.Fprintf(os.Stderr, "storm-probe: %s: %v\n", *path, err)
			return 1
		}
		recs = append(recs, probeRec{at: t0, pwrite: time.Duration(t1 - t0), sync: time.Duration(t2 - t1)})
		if i == 0 {
			fmt.Println("ready")
		}
		time.Sleep(*interval)
	}
	out := bufio.NewWriter(os.Stdout)
	for _, p := range recs {
		fmt.Fprintf(out, "p %d %d %d\n", p.at, p.pwrite, p.sync)
	}
	fmt.Fprintln(out, "end")
	if out.Flush() != nil {
		return 1
	}
	return 0
}
