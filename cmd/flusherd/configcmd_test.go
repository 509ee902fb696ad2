package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"flusherd/config"
	"flusherd/internal/cli"
	"flusherd/internal/testfs"
	"flusherd/tree"
)

// TestPrintDefaultConfigRoundTrip: print-default-config is accepted
// unchanged by check-config (its watch is /var/log), which prints the same
// configuration back without the keys' comments, the keys whose default
// follows another key still commented out; every key has a comment; and
// in the printed file, changing the kupdate interval, the expiry and
// write_chunk changes max_pause, the tree's expire and max_inflight_bytes
// with them, as they would without a file.
func TestPrintDefaultConfigRoundTrip(t *testing.T) {
	var out, errb bytes.Buffer
	if code := Main([]string{"print-default-config"}, &out, &errb); code != cli.ExitOK {
		t.Fatalf("print-default-config: exit %d: %s", code, errb.String())
	}
	if _, err := os.Stat("/var/log"); err != nil {
		testfs.Missing(t, "/var/log: %v", err)
	}
	text := out.String()
	file := filepath.Join(t.TempDir(), "flusherd.toml")
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	var checked bytes.Buffer
	errb.Reset()
	if code := Main([]string{"check-config", file}, &checked, &errb); code != cli.ExitOK {
		t.Fatalf("check-config of the defaults: exit %d: %s", code, errb.String())
	}
	if lines := strings.Split(strings.TrimSpace(errb.String()), "\n"); lines[len(lines)-1] != "flusherd check-config: configuration OK: 1 tree on 1 device" {
		t.Errorf("check-config of the defaults: last line %q, want the verdict", lines[len(lines)-1])
	}
	var want strings.Builder
	keyLine := regexp.MustCompile(`^(# )?([a-z_]+ = .*?) +# (.*)\n$`)
	for _, line := range strings.SplitAfter(text[strings.Index(text, "[writeback]"):], "\n") {
		if strings.Contains(line, " = ") {
			m := keyLine.FindStringSubmatch(line)
			if m == nil {
				t.Errorf("print-default-config: a key without a comment: %q", line)
			} else {
				line = m[1] + m[2] + "\n"
			}
		}
		want.WriteString(line)
	}
	if checked.String() != want.String() {
		t.Errorf("check-config printed\n%s\nwant\n%s", checked.String(), want.String())
	}
	for _, key := range []string{"max_pause", "max_inflight_bytes", "expire"} {
		if !regexp.MustCompile(`(?m)^# default: .*\n# ` + key + ` = `).MatchString(checked.String()) {
			t.Errorf("check-config of the defaults: %s not commented out under its default", key)
		}
	}
	kernel := strings.NewReplacer(`dirty_expire_interval = "5s"`, `dirty_expire_interval = "30s"`,
		`dirty_writeback_interval = "1s"`, `dirty_writeback_interval = "5s"`,
		`write_chunk = "4MiB"`, `write_chunk = "32MiB"`).Replace(text)
	if err := os.WriteFile(file, []byte(kernel), 0o644); err != nil {
		t.Fatal(err)
	}
	checked.Reset()
	if code := Main([]string{"check-config", file}, &checked, &errb); code != cli.ExitOK {
		t.Fatalf("check-config with the kernel's intervals: exit %d: %s", code, errb.String())
	}
	for _, line := range []string{`# max_pause = "5s"`, `# expire = "30s"`, `# max_inflight_bytes = "32MiB"`} {
		if !strings.Contains(checked.String(), "\n"+line+"\n") {
			t.Errorf("the printed defaults with the kernel's intervals and a 32MiB write_chunk give\n%s\nwant %s", checked.String(), line)
		}
	}
}

// TestCheckConfigOutputFollows: check-config's output saved as a file is
// the same configuration, and keeps following where the checked file
// did: a key that follows another is printed as set only where the file
// (or a second [[watch]] entry, or the old name of max_inflight_bytes)
// set it, so that changing the key it follows in the saved file changes
// it as in the original.
func TestCheckConfigOutputFollows(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	cases := []struct{ name, file string }{
		{"none set", fmt.Sprintf("[[watch]]\npath = %q\n", a)},
		{"all set", fmt.Sprintf("[writeback]\nmax_pause = \"3s\"\n[plug]\nmax_inflight_bytes = \"8MiB\"\n[[watch]]\npath = %q\nexpire = \"7s\"\n", a)},
		{"second watch sets expire", fmt.Sprintf("[[watch]]\npath = %q\n[[watch]]\npath = %q\nexpire = \"9s\"\n", a, b)},
		{"old name", fmt.Sprintf("[writeback]\nmax_inflight = \"8MiB\"\n[[watch]]\npath = %q\n", a)},
	}
	// change sets the keys that others follow, in a file that may or may
	// not have a [writeback] table and may set them already.
	change := func(text string) string {
		text = regexp.MustCompile(`(?m)^(dirty_writeback_interval|dirty_expire_interval|write_chunk) = .*\n`).ReplaceAllString(text, "")
		keys := "dirty_writeback_interval = \"4s\"\ndirty_expire_interval = \"40s\"\nwrite_chunk = \"64MiB\"\n"
		if strings.Contains(text, "[writeback]\n") {
			return strings.Replace(text, "[writeback]\n", "[writeback]\n"+keys, 1)
		}
		return "[writeback]\n" + keys + text
	}
	dir := t.TempDir()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			orig := filepath.Join(dir, "orig.toml")
			if err := os.WriteFile(orig, []byte(c.file), 0o644); err != nil {
				t.Fatal(err)
			}
			var out, errb bytes.Buffer
			if code := Main([]string{"check-config", orig}, &out, &errb); code != cli.ExitOK {
				t.Fatalf("check-config: exit %d: %s", code, errb.String())
			}
			saved := filepath.Join(dir, "saved.toml")
			if err := os.WriteFile(saved, out.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			for _, edit := range []func(string) string{func(s string) string { return s }, change} {
				if err := os.WriteFile(orig, []byte(edit(c.file)), 0o644); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(saved, []byte(edit(out.String())), 0o644); err != nil {
					t.Fatal(err)
				}
				want, err := config.Load(orig)
				if err != nil {
					t.Fatalf("the original, edited: %v", err)
				}
				got, err := config.Load(saved)
				if err != nil {
					t.Fatalf("check-config's output, edited: %v\n%s", err, edit(out.String()))
				}
				var w, g bytes.Buffer
				want.Encode(&w)
				got.Encode(&g)
				if w.String() != g.String() {
					t.Errorf("check-config's output read back as\n%s\nthe file as\n%s", g.String(), w.String())
				}
			}
		})
	}
}

func TestCheckConfigRejects(t *testing.T) {
	file := filepath.Join(t.TempDir(), "bad.toml")
	os.WriteFile(file, []byte("[writeback]\ndirty_expire_interval = 30\n"), 0o644)
	var out, errb bytes.Buffer
	code := Main([]string{"check-config", file}, &out, &errb)
	if code != cli.ExitUsage || !strings.Contains(errb.String(), "bad.toml:2: writeback.dirty_expire_interval") {
		t.Fatalf("exit %d, stderr %q: want exit 2 naming file, line and key", code, errb.String())
	}
	if out.Len() != 0 {
		t.Errorf("printed a configuration for a bad file: %s", out.String())
	}
}

// TestSubcommandHelp: each command's -h and --help print its usage on
// standard output and exit 0 (flusherd run --help | less works), with a
// description and the flags shown with two dashes; a usage error prints
// one line and where to look on standard error, and exits 2.
func TestSubcommandHelp(t *testing.T) {
	for _, cmd := range []string{"run", "sync", "dirty", "stats", "check-config", "print-default-config"} {
		for _, h := range []string{"-h", "--help"} {
			var stdout, stderr bytes.Buffer
			if code := Main([]string{cmd, h}, &stdout, &stderr); code != cli.ExitOK || stderr.Len() != 0 ||
				!strings.HasPrefix(stdout.String(), "Usage: flusherd "+cmd) {
				t.Errorf("%s %s: exit %d, stdout %q, stderr %q; want 0 and the usage on stdout only", cmd, h, code, stdout.String(), stderr.String())
			}
			if lines := strings.Split(stdout.String(), "\n"); len(lines) < 3 || lines[1] != "" || lines[2] == "" || strings.HasPrefix(lines[2], "Flags:") {
				t.Errorf("%s %s: no description after the usage line:\n%s", cmd, h, stdout.String())
			}
			if m := regexp.MustCompile(`(?m)^  -[a-z]`).FindString(stdout.String()); m != "" {
				t.Errorf("%s %s: a flag shown with one dash (%q):\n%s", cmd, h, m, stdout.String())
			}
		}
		var stdout, stderr bytes.Buffer
		want := "flusherd " + cmd + ": flag provided but not defined: --no-such-flag\nsee 'flusherd " + cmd + " --help'\n"
		if code := Main([]string{cmd, "--no-such-flag"}, &stdout, &stderr); code != cli.ExitUsage || stdout.Len() != 0 || stderr.String() != want {
			t.Errorf("%s --no-such-flag: exit %d, stdout %q, stderr %q; want 2 and on stderr only %q", cmd, code, stdout.String(), stderr.String(), want)
		}
	}
}

// TestVersionAndHelpSpellings: version and help answer to the spellings
// flusherd(8) promises for flags (-flag and --flag) as well as by name.
func TestVersionAndHelpSpellings(t *testing.T) {
	for _, arg := range []string{"version", "--version", "-version"} {
		var out, errb bytes.Buffer
		if code := Main([]string{arg}, &out, &errb); code != cli.ExitOK || !strings.HasPrefix(out.String(), "flusherd ") {
			t.Errorf("flusherd %s: exit %d, stdout %q, stderr %q; want 0 and the version", arg, code, out.String(), errb.String())
		}
	}
	for _, arg := range []string{"help", "--help", "-help", "-h"} {
		var out, errb bytes.Buffer
		if code := Main([]string{arg}, &out, &errb); code != cli.ExitOK || !strings.Contains(out.String(), "Usage") {
			t.Errorf("flusherd %s: exit %d, stderr %q; want 0 and the usage on stdout", arg, code, errb.String())
		}
	}
}

// TestCheckConfigPrivateDirs: a tree under /tmp or /var/tmp passes, with
// a note that the shipped unit (PrivateTmp=yes) does not see it and the
// setting that would let it; one elsewhere, or on a filesystem without
// writeback (/dev/shm), gets no such note.
func TestCheckConfigPrivateDirs(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		path, note string
	}{{"/var/tmp", "PrivateTmp=yes"}, {"/var/log", ""},
		// A tmpfs: the note says nothing is written back there, and
		// gives no advice on the sandbox.
		{"/dev/shm", ""}}
	if strings.HasPrefix(dir, "/tmp/") {
		cases = append(cases, struct{ path, note string }{dir, "PrivateTmp=yes"})
	}
	for _, p := range []string{"/tmpfoo/x", "/devices"} {
		if _, _, ok := privateDir(p); ok {
			t.Errorf("%s taken for a path under a private directory", p)
		}
	}
	for _, c := range cases {
		cfgPath := filepath.Join(dir, "c.toml")
		if err := os.WriteFile(cfgPath, []byte(fmt.Sprintf("[[watch]]\npath = %q\n", c.path)), 0o644); err != nil {
			t.Fatal(err)
		}
		var out, errb bytes.Buffer
		code := Main([]string{"check-config", cfgPath}, &out, &errb)
		if code != cli.ExitOK {
			t.Fatalf("%s: exit %d: %s", c.path, code, errb.String())
		}
		if got, want := strings.Contains(errb.String(), "the shipped systemd unit replaces with a private one"), c.note != ""; got != want ||
			!strings.Contains(errb.String(), c.note) {
			t.Errorf("%s: note %v, want %q: %s", c.path, got, c.note, errb.String())
		}
		// The note says how to watch it under the unit after all.
		if off := strings.TrimSuffix(c.note, "=yes") + "=no in a drop-in"; c.note != "" && !strings.Contains(errb.String(), off) {
			t.Errorf("%s: the note does not say %q: %s", c.path, off, errb.String())
		}
	}
}

// TestCheckConfigPrivateDirsOnce: several trees under /tmp and /var/tmp
// get one note for PrivateTmp=yes, naming each of them.
func TestCheckConfigPrivateDirsOnce(t *testing.T) {
	dir := t.TempDir()
	if !strings.HasPrefix(dir, "/tmp/") {
		t.Skip("the test directory is not under /tmp")
	}
	var conf strings.Builder
	roots := []string{filepath.Join(dir, "a"), filepath.Join(dir, "b"), "/var/tmp"}
	for _, r := range roots {
		if err := os.MkdirAll(r, 0o755); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&conf, "[[watch]]\npath = %q\n", r)
	}
	cfgPath := filepath.Join(dir, "c.toml")
	if err := os.WriteFile(cfgPath, []byte(conf.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := Main([]string{"check-config", cfgPath}, &out, &errb); code != cli.ExitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if n := strings.Count(errb.String(), "replaces with a private one (PrivateTmp=yes)"); n != 1 || !strings.Contains(errb.String(), "these trees are not there") {
		t.Errorf("%d notes for PrivateTmp=yes, want one for the three trees: %s", n, errb.String())
	}
	for _, r := range roots {
		if !strings.Contains(errb.String(), strconv.Quote(r)) {
			t.Errorf("the note does not name %s: %s", r, errb.String())
		}
	}
}

// TestCheckConfigVerdict: the verdict counts the trees and the filesystems
// they are on.
func TestCheckConfigVerdict(t *testing.T) {
	for _, tc := range []struct {
		trees []string
		want  string
	}{
		{nil, "0 trees on 0 devices"},
		{[]string{"/var/log"}, "1 tree on 1 device"},
		{[]string{"/var/log", "/proc/self"}, "2 trees on 2 devices"},
	} {
		var ws []config.Watch
		for _, p := range tc.trees {
			ws = append(ws, config.Watch{Tree: tree.Tree{Root: p}})
		}
		if got := verdict(ws); got != tc.want {
			t.Errorf("verdict(%v) = %q, want %q", tc.trees, got, tc.want)
		}
	}
}

// TestClientConfigProblems: the client commands read stats.dir from a
// configuration file whose other keys have problems (a file a reload
// refused, which the daemon runs without), warning of them, and reach for
// the daemon there; a problem of stats.dir itself is a usage error, and
// --stats-dir reads no file.
func TestClientConfigProblems(t *testing.T) {
	dir := t.TempDir()
	run := filepath.Join(dir, "run")
	bad := filepath.Join(dir, "bad.toml")
	if err := os.WriteFile(bad, []byte("[writeback]\nbogus = 1\n[stats]\ndir = \""+run+"\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	badDir := filepath.Join(dir, "baddir.toml")
	if err := os.WriteFile(badDir, []byte("[stats]\ndir = \"\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{"status", "dirty", "sync", "stats"} {
		code, out := runAs(t, nil, cmd, "--config", bad)
		if code == cli.ExitUsage || !strings.Contains(out, "warning") || !strings.Contains(out, "writeback.bogus") || !strings.Contains(out, run) {
			t.Errorf("%s with a file whose other keys have problems: exit %d, output %q; want a warning naming writeback.bogus and a look in %s", cmd, code, out, run)
		}
		if code, out := runAs(t, nil, cmd, "--config", badDir); code != cli.ExitUsage || !strings.Contains(out, "stats.dir") {
			t.Errorf("%s with a bad stats.dir: exit %d, output %q; want %d naming stats.dir", cmd, code, out, cli.ExitUsage)
		}
		if code, out := runAs(t, nil, cmd, "--config", badDir, "--stats-dir", run); code == cli.ExitUsage || strings.Contains(out, "warning") {
			t.Errorf("%s with --stats-dir: exit %d, output %q; want the file not read", cmd, code, out)
		}
	}
}
