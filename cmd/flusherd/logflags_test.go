package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"flusherd/control"
	"flusherd/internal/cli"
	"flusherd/internal/logpath"
	"flusherd/internal/testwait"
)

// TestRunLogFlagsUsage: a bad --log-level or --log-format is a usage
// error (exit 2) naming the flag, the value and the accepted ones, before
// anything runs; --help lists both flags.
func TestRunLogFlagsUsage(t *testing.T) {
	tree := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--log-level", "verbose"}, `invalid value "verbose" for flag --log-level: want one of debug, info, warn, error`},
		{[]string{"--log-format=text"}, `invalid value "text" for flag --log-format: want one of console, json`},
		{[]string{"--log-level="}, `invalid value "" for flag --log-level: want one of debug, info, warn, error`},
	} {
		var out, errb bytes.Buffer
		code := Main(append([]string{"run", "--watch", tree}, tc.args...), &out, &errb)
		if code != cli.ExitUsage || !strings.Contains(errb.String(), tc.want) || out.Len() != 0 {
			t.Errorf("run %q: exit %d, stderr:\n%s\nwant exit %d and %q", tc.args, code, errb.String(), cli.ExitUsage, tc.want)
		}
	}
	var out bytes.Buffer
	if code := Main([]string{"run", "--help"}, &out, &out); code != cli.ExitOK ||
		!strings.Contains(out.String(), "-log-level level") || !strings.Contains(out.String(), "-log-format format") {
		t.Errorf("run --help: exit %d:\n%s", code, out.String())
	}
}

// logRun is a flusherd run started with args (and --stats-dir).
type logRun struct {
	cmd      *exec.Cmd
	out      *syncBuffer
	statsDir string
	done     chan error
}

// startLogRun starts the flusherd binary with "run", args and a stats
// directory of its own, and waits for its control socket (the log alone
// cannot say, at a level above info).
func startLogRun(t *testing.T, args ...string) *logRun {
	t.Helper()
	r := &logRun{out: &syncBuffer{}, statsDir: filepath.Join(t.TempDir(), "run"), done: make(chan error, 1)}
	r.cmd = exec.Command(binary, append([]string{"run", "--stats-dir", r.statsDir}, args...)...)
	r.cmd.Env = append(os.Environ(), "JOURNAL_STREAM=", "NOTIFY_SOCKET=")
	r.cmd.Stdout, r.cmd.Stderr = r.out, r.out
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { r.done <- r.cmd.Wait() }()
	t.Cleanup(func() { r.cmd.Process.Kill() })
	testwait.For(t, "the control socket", 30*time.Second, func() bool {
		_, err := os.Stat(control.SocketPath(r.statsDir))
		return err == nil
	})
	return r
}

// stop sends SIGTERM and returns the whole output once the daemon exited 0.
func (r *logRun) stop(t *testing.T) string {
	t.Helper()
	r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-r.done:
		if err != nil {
			t.Fatalf("flusherd run: %v\n%s", err, r.out.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("flusherd run did not exit within 60 s of SIGTERM:\n%s", r.out.String())
	}
	return r.out.String()
}

// TestRunLogFormatJSON: with --log-format json --log-level debug (over a
// configuration's console and error), every line is a JSON object, info
// lines are there, and the roots logged decode to exactly the trees: one
// whose name has quotes and spaces, one whose name is not UTF-8.
func TestRunLogFormatJSON(t *testing.T) {
	base := t.TempDir()
	quoted, latin1 := filepath.Join(base, `a "quoted" tree`), filepath.Join(base, "caf\xe9")
	mkdirs(t, quoted, latin1)
	cfg := filepath.Join(base, "flusherd.toml")
	if err := os.WriteFile(cfg, []byte("[log]\nlevel = \"error\"\nformat = \"console\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := startLogRun(t, "--config", cfg, "--watch", quoted, "--watch", latin1, "--log-format", "json", "--log-level", "debug")
	out := r.stop(t)
	roots := map[string]bool{}
	infos := 0
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		var e map[string]any
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatalf("line %q is not a JSON object: %v\n%s", l, err, out)
		}
		if e["level"] == "info" {
			infos++
		}
		if e["msg"] == "watching" {
			s, _ := e["root"].(string)
			p, err := logpath.Parse(s)
			if err != nil {
				t.Errorf("root %q: %v", s, err)
			}
			roots[p] = true
		}
	}
	if !roots[quoted] || !roots[latin1] || len(roots) != 2 || infos == 0 {
		t.Errorf("the watching lines name %v (want %q and %q), %d info lines:\n%s", roots, quoted, latin1, infos, out)
	}
}

// TestRunLogLevelWarn: --log-level warn over a configuration's debug,
// also after a reload: only warnings and errors are logged (the reload's
// warning about a start-only key shows that it happened).
func TestRunLogLevelWarn(t *testing.T) {
	tree, base := t.TempDir(), t.TempDir()
	cfg := filepath.Join(base, "flusherd.toml")
	conf := "[log]\nlevel = \"debug\"\n[[watch]]\npath = \"" + tree + "\"\n"
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	r := startLogRun(t, "--config", cfg, "--log-level", "warn")
	if err := os.WriteFile(cfg, []byte(conf+"[watcher]\nrescan_interval = \"11s\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r.cmd.Process.Signal(syscall.SIGHUP)
	testwait.For(t, "the reload's warning", 10*time.Second, func() bool {
		return strings.Contains(r.out.String(), "this setting changes at the next start")
	})
	writeDirty(t, filepath.Join(tree, "f"), 16<<10)
	out := r.stop(t)
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if f := strings.Split(l, "\t"); len(f) < 3 || (f[1] != "WARN" && f[1] != "ERROR") {
			t.Errorf("at --log-level warn, a line that is not a console line of a warning or an error: %q", l)
		}
	}
}
