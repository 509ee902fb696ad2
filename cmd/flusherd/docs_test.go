package main

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"flusherd/bdi"
	"flusherd/internal/cli"
	"flusherd/watch"
)

// The man pages' sources, the reference for every command, flag, exit
// code, environment variable, stats line and configuration key.
const (
	manPage8    = "../../doc/flusherd.8.md"
	manPageToml = "../../doc/flusherd.toml.5.md"
)

func readDoc(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// runMain runs flusherd with args and returns its standard output; it
// fails the test unless the exit code is 0.
func runMain(t *testing.T, args ...string) string {
	t.Helper()
	var out, errb bytes.Buffer
	if code := Main(args, &out, &errb); code != cli.ExitOK {
		t.Fatalf("flusherd %s: exit %d\n%s", strings.Join(args, " "), code, errb.String())
	}
	return out.String()
}

// manSection returns the text of the top-level section "# name" of a
// man page's source, up to the next one.
func manSection(t *testing.T, doc, name string) string {
	t.Helper()
	_, rest, ok := strings.Cut(doc, "\n# "+name+"\n")
	if !ok {
		t.Fatalf("the man page has no section \"# %s\"", name)
	}
	if i := strings.Index(rest, "\n# "); i >= 0 {
		rest = rest[:i]
	}
	return rest
}

// subsections splits a section's text at its "## NAME" lines, keyed by
// NAME; the text before the first one is left out.
func subsections(text string) map[string]string {
	m := map[string]string{}
	name := ""
	for _, l := range strings.SplitAfter(text, "\n") {
		if n, ok := strings.CutPrefix(l, "## "); ok {
			name = strings.TrimSpace(n)
			m[name] = ""
			continue
		}
		if name != "" {
			m[name] += l
		}
	}
	return m
}

var (
	usageCommand = regexp.MustCompile(`(?m)^  flusherd ([a-z][a-z-]*)(.*)$`)
	usageFlag    = regexp.MustCompile(`--([a-z][a-z0-9-]*)`)
	helpFlag     = regexp.MustCompile(`(?m)^  --([a-z][a-z0-9-]*)`)
	docFlagTerm  = regexp.MustCompile(`(?m)^\*\*--([a-z][a-z0-9-]*)\*\*`)
)

// TestManPageCommands: flusherd(8) documents every command of `flusherd
// --help` in a section "## COMMAND" under COMMANDS, with its synopsis, and
// every flag of the command's --help there as a definition "**--flag**";
// it documents no command and no flag that the binary does not have.
func TestManPageCommands(t *testing.T) {
	cmdsDoc := subsections(manSection(t, readDoc(t, manPage8), "COMMANDS"))
	var cmds []string
	for _, m := range usageCommand.FindAllStringSubmatch(runMain(t, "--help"), -1) {
		cmd := m[1]
		cmds = append(cmds, cmd)
		sec, ok := cmdsDoc[cmd]
		if !ok {
			t.Errorf("flusherd(8): no section \"## %s\" under COMMANDS for the command %s", cmd, cmd)
			continue
		}
		if !strings.Contains(sec, "**flusherd "+cmd+"**") {
			t.Errorf("flusherd(8), ## %s: no synopsis line \"**flusherd %s** ...\"", cmd, cmd)
		}
		var flags []string
		for _, f := range helpFlag.FindAllStringSubmatch(runMain(t, cmd, "--help"), -1) {
			flags = append(flags, f[1])
		}
		// The usage line's flags are the command's: a --help whose
		// flags this test cannot read fails here, not silently.
		for _, f := range usageFlag.FindAllStringSubmatch(m[2], -1) {
			if f[1] != "version" && !slices.Contains(flags, f[1]) {
				t.Errorf("flusherd %s --help: the usage names --%s, but no flag line \"  --%s\" was found", cmd, f[1], f[1])
			}
		}
		for _, f := range flags {
			if !regexp.MustCompile(`(?m)^\*\*--` + regexp.QuoteMeta(f) + `\*\*`).MatchString(sec) {
				t.Errorf("flusherd(8), ## %s: the flag --%s (from `flusherd %s --help`) is not documented there (a line starting \"**--%s**\")", cmd, f, cmd, f)
			}
		}
		for _, f := range docFlagTerm.FindAllStringSubmatch(sec, -1) {
			if !slices.Contains(flags, f[1]) {
				t.Errorf("flusherd(8), ## %s: documents --%s, which `flusherd %s --help` does not have", cmd, f[1], cmd)
			}
		}
	}
	if len(cmds) < 7 {
		t.Fatalf("found only the commands %q in `flusherd --help`", cmds)
	}
	for name := range cmdsDoc {
		if !slices.Contains(cmds, name) {
			t.Errorf("flusherd(8) documents a command %q that `flusherd --help` does not list", name)
		}
	}
}

// docKeyTerm is a key's definition in flusherd.toml(5): "**table.key** = ".
var docKeyTerm = regexp.MustCompile(`(?m)^\*\*([a-z_]+\.[a-z_]+)\*\* = `)

// commentedKey is a line of print-default-config that prints a key
// commented out ("# max_pause = ..."), without the "# ".
var commentedKey = regexp.MustCompile(`^[a-z_]+ = `)

// TestManPageConfigKeys: flusherd.toml(5) documents every key that
// `flusherd print-default-config` prints, as a definition "**table.key** =
// ...", with the default value printed there (for the keys of the single
// tables), and no key that is not printed.
func TestManPageConfigKeys(t *testing.T) {
	doc := readDoc(t, manPageToml)
	// The text of each key's definition: from its term to the next term
	// or heading.
	entries := map[string]string{}
	locs := docKeyTerm.FindAllStringSubmatchIndex(doc, -1)
	for i, loc := range locs {
		end := len(doc)
		if i+1 < len(locs) {
			end = locs[i+1][0]
		}
		if h := strings.Index(doc[loc[1]:end], "\n#"); h >= 0 {
			end = loc[1] + h
		}
		entries[doc[loc[2]:loc[3]]] = doc[loc[0]:end]
	}

	var keys []string
	table, array := "", false
	sc := bufio.NewScanner(strings.NewReader(runMain(t, "print-default-config")))
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if k := strings.TrimPrefix(l, "# "); k != l && commentedKey.MatchString(k) {
			l = k // a key printed commented out: its default follows another key
		}
		switch {
		case l == "" || strings.HasPrefix(l, "#"):
		case strings.HasPrefix(l, "[["):
			table, array = strings.Trim(l, "[]"), true
		case strings.HasPrefix(l, "["):
			table, array = strings.Trim(l, "[]"), false
		default:
			k, v, ok := strings.Cut(l, "=")
			if !ok || table == "" {
				t.Fatalf("print-default-config: cannot read the line %q", l)
			}
			key := table + "." + strings.TrimSpace(k)
			if i := strings.Index(v, " # "); i >= 0 {
				v = v[:i] // the key's comment (no default holds " # ")
			}
			keys = append(keys, key)
			entry, ok := entries[key]
			switch {
			case !ok:
				t.Errorf("flusherd.toml(5): the key %s (from print-default-config) is not documented (a line starting \"**%s** = \")", key, key)
			case !array && !strings.Contains(entry, "`"+strings.TrimSpace(v)+"`"):
				t.Errorf("flusherd.toml(5): the key %s: its default, `%s`, is not given", key, strings.TrimSpace(v))
			}
		}
	}
	if len(keys) < 20 {
		t.Fatalf("print-default-config printed only the keys %q", keys)
	}
	for key := range entries {
		if !slices.Contains(keys, key) {
			t.Errorf("flusherd.toml(5) documents %s, which print-default-config does not print", key)
		}
	}
}

// TestManPageExitCodes: flusherd(8)'s EXIT STATUS defines each exit code
// of the commands.
func TestManPageExitCodes(t *testing.T) {
	sec := manSection(t, readDoc(t, manPage8), "EXIT STATUS")
	for _, code := range []int{cli.ExitOK, cli.ExitFailed, cli.ExitUsage, cli.ExitUnreachable} {
		if !strings.Contains(sec, "\n**"+strconv.Itoa(code)+"**\n:   ") {
			t.Errorf("flusherd(8), EXIT STATUS: no definition of the exit code %d (\"**%d**\" and \":   ...\")", code, code)
		}
	}
}

var getenv = regexp.MustCompile(`os\.(?:Getenv|LookupEnv)\("([A-Za-z_][A-Za-z0-9_]*)"\)`)

// TestManPageEnvironment: every environment variable that the daemon's
// code reads by name (os.Getenv, os.LookupEnv in the packages the binary
// is built from) is in flusherd(8)'s ENVIRONMENT.
func TestManPageEnvironment(t *testing.T) {
	sec := manSection(t, readDoc(t, manPage8), "ENVIRONMENT")
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command, to list the binary's packages: %v", err)
	}
	out, err := exec.Command(goBin, "list", "-deps", "-f", "{{if .Module}}{{if .Module.Main}}{{.Dir}}{{end}}{{end}}", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	var vars []string
	for _, dir := range strings.Fields(string(out)) {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range getenv.FindAllStringSubmatch(string(src), -1) {
				vars = append(vars, m[1])
				if !strings.Contains(sec, "**"+m[1]+"**") {
					t.Errorf("%s reads $%s, which flusherd(8)'s ENVIRONMENT does not name (as **%s**)", f, m[1], m[1])
				}
			}
		}
	}
	if len(vars) < 3 {
		t.Fatalf("found only the environment variables %q in the binary's packages", vars)
	}
}

// TestManPageStatsLines: flusherd(8)'s STATISTICS defines every line of a
// device's stats file (bdi.Stats.Format) and of the watcher's
// (watch.WriteStats), as "**name**".
func TestManPageStatsLines(t *testing.T) {
	sec := manSection(t, readDoc(t, manPage8), "STATISTICS")
	var buf bytes.Buffer
	if err := (&bdi.Stats{}).Format(&buf, 4096); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := watch.WriteStats(dir, "fanotify", &watch.Counters{}, []watch.TreeUse{{Root: "/srv", Backend: "fanotify", Served: true}}); err != nil {
		t.Fatal(err)
	}
	ws, err := os.ReadFile(filepath.Join(dir, "watch", "stats"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range strings.Split(buf.String()+string(ws), "\n") {
		name, _, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		n++
		if !strings.Contains(sec, "**"+name+"**") {
			t.Errorf("flusherd(8), STATISTICS: the stats line %q is not defined (as **%s**)", name, name)
		}
	}
	if n < 30 {
		t.Fatalf("found only %d stats lines", n)
	}
}

// TestReadmeTestCommands: the README's test commands are those .ci/run
// runs: the full lane exactly, and the fast lane's flags are among those
// of .ci/run's -short lane.
func TestReadmeTestCommands(t *testing.T) {
	readme, ci := readDoc(t, "../../README.md"), readDoc(t, "../../.ci/run")
	goTest := regexp.MustCompile(`(?m)^go test .*$`)
	// A command's words, its comment left out.
	words := func(cmd string) []string {
		cmd, _, _ = strings.Cut(cmd, "#")
		return strings.Fields(cmd)
	}
	var ciCmds [][]string
	for _, c := range goTest.FindAllString(ci, -1) {
		ciCmds = append(ciCmds, words(c))
	}
	var short, full bool
	for _, c := range goTest.FindAllString(readme, -1) {
		w := words(c)
		if slices.Contains(w, "-short") {
			short = true
		} else {
			full = true
		}
		if !slices.ContainsFunc(ciCmds, func(ciw []string) bool {
			if slices.Contains(w, "-short") {
				return slices.Contains(ciw, "-short") && !slices.ContainsFunc(w, func(s string) bool { return !slices.Contains(ciw, s) })
			}
			return slices.Equal(w, ciw)
		}) {
			t.Errorf("the README's %q is not a test command of .ci/run (%q)", strings.Join(w, " "), ciCmds)
		}
	}
	if !short || !full {
		t.Errorf("the README shows the fast lane (go test -short ...): %v, and the full lane: %v; want both", short, full)
	}
}

// TestReadmeLength: the README is one screenful of orientation; the
// reference is in the man pages and the rest in docs/.
func TestReadmeLength(t *testing.T) {
	const maxLines = 300
	if n := strings.Count(readDoc(t, "../../README.md"), "\n"); n > maxLines {
		t.Errorf("README.md has %d lines; keep it to %d and move the rest to doc/ (man pages) or docs/", n, maxLines)
	}
}
