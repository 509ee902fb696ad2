package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/procfs"
)

// daemon is a running flusherd.
type daemon struct {
	cmd  *exec.Cmd
	log  *bytes.Buffer
	mu   sync.Mutex
	done chan struct{}
}

func (d *daemon) logText() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.log.String()
}

type lockedWriter struct{ d *daemon }

func (w lockedWriter) Write(p []byte) (int, error) {
	w.d.mu.Lock()
	defer w.d.mu.Unlock()
	return w.d.log.Write(p)
}

func startDaemon(bin, dir, configText string) (*daemon, error) {
	return startDaemonAttr(bin, dir, configText, nil)
}

// startDaemonAttr is startDaemon with the child's process attributes.
func startDaemonAttr(bin, dir, configText string, attr *syscall.SysProcAttr) (*daemon, error) {
	cfg := filepath.Join(dir, "flusherd.toml")
	if err := os.WriteFile(cfg, []byte(configText), 0o644); err != nil {
		return nil, err
	}
	d := &daemon{log: &bytes.Buffer{}, done: make(chan struct{})}
	d.cmd = exec.Command(bin, "run", "--config", cfg, "--stats-dir", filepath.Join(dir, "run"))
	d.cmd.Stdout = lockedWriter{d}
	d.cmd.Stderr = lockedWriter{d}
	d.cmd.SysProcAttr = attr
	if err := d.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { d.cmd.Wait(); close(d.done) }()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(d.logText(), "ready") {
		select {
		case <-d.done:
			return nil, fmt.Errorf("flusherd exited: %s", d.logText())
		default:
		}
		if time.Now().After(deadline) {
			d.stop()
			return nil, fmt.Errorf("flusherd not ready: %s", d.logText())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return d, nil
}

func (d *daemon) stop() {
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(60 * time.Second):
		d.cmd.Process.Kill()
		<-d.done
	}
}

// kill sends SIGKILL, if the daemon still runs, and waits for it to exit.
func (d *daemon) kill() {
	select {
	case <-d.done:
		return
	default:
	}
	d.cmd.Process.Kill()
	<-d.done
}

// cpu returns the process's user+system CPU time (procfs: utime + stime
// of /proc/PID/stat, counted in USER_HZ ticks).
func (d *daemon) cpu() time.Duration {
	p, err := procfs.NewProc(d.cmd.Process.Pid)
	if err != nil {
		return 0
	}
	st, err := p.Stat()
	if err != nil {
		return 0
	}
	return time.Duration(st.CPUTime() * float64(time.Second))
}

// switches returns the context switches, voluntary and not, of all the
// process's threads: every wakeup of the writeback goroutine costs at least
// one, so their rate bounds the wakeups from above.
func (d *daemon) switches() uint64 {
	threads, err := procfs.AllThreads(d.cmd.Process.Pid)
	if err != nil {
		return 0
	}
	var n uint64
	for _, t := range threads {
		if s, err := t.NewStatus(); err == nil {
			n += s.VoluntaryCtxtSwitches + s.NonVoluntaryCtxtSwitches
		}
	}
	return n
}
