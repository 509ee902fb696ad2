package main

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

// TestRunLogFormatJSON: with --log-format json --log-level debug (over a
// configuration's console and error), every line is a JSON object, info
// lines are there, and the roots logged decode to exactly the trees: one
// whose name has quotes and spaces, one whose name is not UTF-8.
func TestRunLogFormatJSON(t *testing.T) {
	base := t.TempDir()
	quoted, latin1 := filepath.Join(base, `a "quoted" tree`), filepath.Join(base, "caf\xe9")
	mkdirs(t, quoted, latin1)
	d := runDaemon(t, "[log]\nlevel = \"error\"\nformat = \"console\"\n", daemonOpts{readySocket: true, env: []string{"JOURNAL_STREAM=", "NOTIFY_SOCKET="},
		args: []string{"--watch", quoted, "--watch", latin1, "--log-format", "json", "--log-level", "debug"}})
	d.stop(t)
	out := d.log.String()
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
	tree := t.TempDir()
	conf := "[log]\nlevel = \"debug\"\n[[watch]]\npath = \"" + tree + "\"\n"
	d := runDaemon(t, conf, daemonOpts{readySocket: true, env: []string{"JOURNAL_STREAM=", "NOTIFY_SOCKET="}, args: []string{"--log-level", "warn"}})
	d.reload(t, conf+"[watcher]\nrescan_interval = \"11s\"\n")
	testwait.For(t, "the reload's warning", 10*time.Second, func() bool {
		return strings.Contains(d.log.String(), "this setting changes at the next start")
	})
	writeDirty(t, filepath.Join(tree, "f"), 16<<10)
	d.stop(t)
	out := d.log.String()
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if f := strings.Split(l, "\t"); len(f) < 3 || (f[1] != "WARN" && f[1] != "ERROR") {
			t.Errorf("at --log-level warn, a line that is not a console line of a warning or an error: %q", l)
		}
	}
}
