package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

type writerSet struct {
	procs []*exec.Cmd
	stdin []io.WriteCloser
	lines chan writerLine
}

type writerLine struct {
	i    int
	text string
	err  error
}

func startWriters(ctx context.Context, o watchOpts, root, mode string, g *cpuGroup) (*writerSet, error) {
	ws := &writerSet{lines: make(chan writerLine, 4*o.writers)}
	for i := range o.writers {
		cmd := exec.Command(o.self, watchWriterCmd, "--root", root, "--files", strconv.Itoa(o.files),
			"--writers", strconv.Itoa(o.writers), "--index", strconv.Itoa(i), "--mode", mode, "--duration", o.duration.String())
		cmd.Stderr = os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		in, err := cmd.StdinPipe()
		if err != nil {
			ws.kill()
			return nil, err
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			ws.kill()
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			ws.kill()
			return nil, err
		}
		ws.procs = append(ws.procs, cmd)
		ws.stdin = append(ws.stdin, in)
		if g != nil {
			// Before it says "ready": it writes only when told to.
			if err := g.add(cmd.Process.Pid); err != nil {
				ws.kill()
				return nil, fmt.Errorf("moving writer %d into %s: %w", i, g.dir, err)
			}
		}
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				ws.lines <- writerLine{i: i, text: sc.Text()}
				if strings.HasPrefix(sc.Text(), "writes ") {
					return // its last line
				}
			}
			ws.lines <- writerLine{i: i, err: fmt.Errorf("writer %d: exited early", i)}
		}()
	}
	// Each writer opens its files, then says "ready".
	for range o.writers {
		l, err := ws.next(ctx, time.Minute)
		if err != nil {
			ws.kill()
			return nil, err
		}
		if l.text != "ready" {
			ws.kill()
			return nil, fmt.Errorf("writer %d: %q", l.i, l.text)
		}
	}
	return ws, nil
}

func (ws *writerSet) next(ctx context.Context, limit time.Duration) (writerLine, error) {
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case l := <-ws.lines:
		return l, l.err
	case <-ctx.Done():
		return writerLine{}, ctx.Err()
	case <-t.C:
		return writerLine{}, errors.New("writers: no answer")
	}
}

func (ws *writerSet) start() error {
	for _, in := range ws.stdin {
		if _, err := io.WriteString(in, "go\n"); err != nil {
			return err
		}
	}
	return nil
}

// wait collects the writers' counts: the writes issued, and the sum of the
// writers' rates.
func (ws *writerSet) wait(ctx context.Context, limit time.Duration) (uint64, float64, error) {
	var total uint64
	var rate float64
	deadline := time.Now().Add(limit)
	for range ws.procs {
		l, err := ws.next(ctx, time.Until(deadline))
		if err != nil {
			return 0, 0, err
		}
		var n, ns uint64
		if _, err := fmt.Sscanf(l.text, "writes %d %d", &n, &ns); err != nil || ns == 0 {
			return 0, 0, fmt.Errorf("writer %d: %q", l.i, l.text)
		}
		total += n
		rate += float64(n) / (float64(ns) / 1e9)
	}
	for _, p := range ws.procs {
		p.Wait()
	}
	ws.procs = nil
	return total, rate, nil
}

func (ws *writerSet) kill() {
	for _, p := range ws.procs {
		p.Process.Kill()
		p.Wait()
	}
	ws.procs = nil
}

// treePath is the i-th file of a tree made by createTree.
func treePath(root string, i int) string {
	return filepath.Join(root, fmt.Sprintf("d%04d", i/1000), fmt.Sprintf("f%03d", i%1000))
}

// createTree creates n files of size bytes under root, 1,000 to a
// directory.
func createTree(ctx context.Context, root string, n, size int) error {
	buf := make([]byte, size)
	for i := range buf {
		buf[i] = 'x'
	}
	for i := range n {
		if i%1000 == 0 {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err := os.MkdirAll(filepath.Dir(treePath(root, i)), 0o755); err != nil {
				return err
			}
		}
		p := treePath(root, i)
		fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_CLOEXEC, 0o644)
		if err != nil {
			return &fs.PathError{Op: "create", Path: p, Err: err}
		}
		_, err = unix.Write(fd, buf)
		unix.Close(fd)
		if err != nil {
			return &fs.PathError{Op: "write", Path: p, Err: err}
		}
	}
	if n == 0 {
		return os.MkdirAll(root, 0o755)
	}
	return nil
}

// watchWriter is one writer process: it opens its share of the files,
// prints "ready", waits for a line on stdin, writes for --duration and
// prints "writes N NANOSECONDS".
func watchWriter(args []string) int {
	fl := flag.NewFlagSet(watchWriterCmd, flag.ContinueOnError)
	root := fl.String("root", "", "tree")
	files := fl.Int("files", 0, "files in the tree")
	writers := fl.Int("writers", 1, "writers")
	index := fl.Int("index", 0, "this writer's index")
	mode := fl.String("mode", "pwrite", "pwrite or reopen")
	duration := fl.Duration("duration", 10*time.Second, "how long to write")
	if err := fl.Parse(args); err != nil {
		return 2
	}
	var paths []string
	for i := *index; i < *files; i += *writers {
		paths = append(paths, treePath(*root, i))
	}
	var fds []int
	if *mode == "pwrite" {
		for _, p := range paths {
			fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				fmt.Fprintf(os.Stderr, "watch-writer: %s: %v\n", p, err)
				return 1
			}
			fds = append(fds, fd)
		}
	}
	fmt.Println("ready")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return 1
	}
	buf := make([]byte, 64)
	for i := range buf {
		buf[i] = 'w'
	}
	var n uint64
	start := time.Now()
	end := start.Add(*duration)
	for round := 0; ; round++ {
		off := int64(round%64) * 64
		for i := range paths {
			if n%256 == 0 && time.Now().After(end) {
				fmt.Printf("writes %d %d\n", n, time.Since(start).Nanoseconds())
				return 0
			}
			if *mode == "pwrite" {
				if _, err := unix.Pwrite(fds[i], buf, off); err != nil {
					fmt.Fprintf(os.Stderr, "watch-writer: pwrite %s: %v\n", paths[i], err)
					return 1
				}
			} else {
				fd, err := unix.Open(paths[i], unix.O_WRONLY|unix.O_CLOEXEC, 0)
				if err != nil {
					fmt.Fprintf(os.Stderr, "watch-writer: %s: %v\n", paths[i], err)
					return 1
				}
				_, err = unix.Pwrite(fd, buf, off)
				unix.Close(fd)
				if err != nil {
					fmt.Fprintf(os.Stderr, "watch-writer: pwrite %s: %v\n", paths[i], err)
					return 1
				}
			}
			n++
		}
	}
}
