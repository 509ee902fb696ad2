package main

import (
	"bufio"
	"bytes"
	"os"
	"regexp"
	"strings"
	"testing"

	"flusherd/internal/cli"
)

// TestReadmeMatchesCLI keeps the README true to the binary: every command
// of the usage has a row in the README's Commands table, every key that
// print-default-config prints is in its Configuration table, and the
// README's test command is the one .ci/run runs.
func TestReadmeMatchesCLI(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if code := Main([]string{"--help"}, &out, &out); code != cli.ExitOK {
		t.Fatalf("--help: exit %d", code)
	}
	cmds := regexp.MustCompile(`(?m)^  flusherd ([a-z-]+)`).FindAllStringSubmatch(out.String(), -1)
	if len(cmds) < 5 {
		t.Fatalf("found %d commands in the usage:\n%s", len(cmds), out.String())
	}
	for _, m := range cmds {
		if !bytes.Contains(readme, []byte("| `flusherd "+m[1])) {
			t.Errorf("README's Commands table has no row for `flusherd %s`", m[1])
		}
	}
	out.Reset()
	if code := Main([]string{"print-default-config"}, &out, &out); code != cli.ExitOK {
		t.Fatalf("print-default-config: exit %d", code)
	}
	table, keys := "", 0
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if k := strings.TrimPrefix(line, "# "); k != line && strings.Contains(k, " = ") && !strings.Contains(k[:strings.Index(k, " = ")], " ") {
			line = k // a key printed commented out: its default follows another key
		}
		switch {
		case strings.HasPrefix(line, "[[watch]]"):
			table = "watch"
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			table = strings.Trim(line, "[]")
		case strings.Contains(line, " = ") && !strings.HasPrefix(line, "#"):
			name := strings.TrimSpace(line[:strings.Index(line, " = ")])
			key := "`" + table + "." + name + "`"
			if table == "watch" {
				key = "`[[watch]] " + name + "`"
			}
			keys++
			if !bytes.Contains(readme, []byte(key)) {
				t.Errorf("README's Configuration table lacks %s", key)
			}
		}
	}
	if keys < 10 {
		t.Fatalf("found %d keys in print-default-config", keys)
	}
	ci, err := os.ReadFile("../../.ci/run")
	if err != nil {
		t.Fatal(err)
	}
	const testCmd = "go test -race -count=1 -timeout 15m ./..."
	if !bytes.Contains(readme, []byte(testCmd)) || !bytes.Contains(ci, []byte(testCmd)) {
		t.Errorf("the README's test command %q is not the one .ci/run runs", testCmd)
	}
}
