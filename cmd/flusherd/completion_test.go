package main

import (
	"bytes"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"flusherd/internal/cli"
	"flusherd/internal/testfs"
)

// commandFlags returns each command of flusherd --help with the flags its
// --help lists (without --help).
func commandFlags(t *testing.T) map[string][]string {
	t.Helper()
	var out bytes.Buffer
	if code := Main([]string{"--help"}, &out, &out); code != cli.ExitOK {
		t.Fatalf("--help: exit %d", code)
	}
	cmds := map[string][]string{}
	for _, m := range regexp.MustCompile(`(?m)^  flusherd ([a-z-]+)`).FindAllStringSubmatch(out.String(), -1) {
		var help bytes.Buffer
		Main([]string{m[1], "--help"}, &help, &help)
		flags := []string{}
		for _, f := range regexp.MustCompile(`(?m)^  (--[a-z-]+)`).FindAllStringSubmatch(help.String(), -1) {
			flags = append(flags, f[1])
		}
		cmds[m[1]] = flags
	}
	if len(cmds) < 6 {
		t.Fatalf("found %d commands in the usage:\n%s", len(cmds), out.String())
	}
	return cmds
}

// needShell returns the path of shell, failing under CI=true when it is
// missing and skipping otherwise.
func needShell(t *testing.T, shell string) string {
	t.Helper()
	p, err := exec.LookPath(shell)
	if err != nil {
		testfs.Missing(t, "%s is not installed (apt-get install %s)", shell, shell)
	}
	return p
}

// TestCompletions: the bash, zsh and fish completions (completions/) offer
// every command of flusherd --help and, after a command, exactly the flags
// its --help lists (bash and fish, asked as the shell asks them), and zsh's
// names each of them; all three parse.
func TestCompletions(t *testing.T) {
	cmds := commandFlags(t)
	bash := needShell(t, "bash")
	ask := func(words ...string) []string {
		script := `source ../../completions/flusherd.bash; COMP_WORDS=(` + strings.Join(words, " ") + `); COMP_CWORD=$((${#COMP_WORDS[@]}-1)); _flusherd; printf '%s\n' "${COMPREPLY[@]}"`
		out, err := exec.Command(bash, "-c", script).CombinedOutput()
		if err != nil {
			t.Fatalf("bash completion of %q: %v\n%s", words, err, out)
		}
		return strings.Fields(string(out))
	}
	fishPath := needShell(t, "fish")
	fish := func(line string) []string {
		out, err := exec.Command(fishPath, "--no-config", "-c", "source ../../completions/flusherd.fish; complete -C '"+line+"'").CombinedOutput()
		if err != nil {
			t.Fatalf("fish completion of %q: %v\n%s", line, err, out)
		}
		var got []string
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if l != "" {
				got = append(got, strings.SplitN(l, "\t", 2)[0])
			}
		}
		return got
	}
	zsh, err := os.ReadFile("../../completions/_flusherd")
	if err != nil {
		t.Fatal(err)
	}
	top := ask("flusherd", "''")
	for cmd, flags := range cmds {
		if !slices.Contains(top, cmd) {
			t.Errorf("bash: %q not offered as a command (offered %q)", cmd, top)
		}
		if !regexp.MustCompile(`(?m)^\s*'` + cmd + `:`).Match(zsh) {
			t.Errorf("zsh: no description of the command %q", cmd)
		}
		want := append(slices.Clone(flags), "--help")
		slices.Sort(want)
		got := ask("flusherd", cmd, "--")
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("bash: flusherd %s --<TAB> offers %q, want %q", cmd, got, want)
		}
		got = fish("flusherd " + cmd + " --")
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("fish: flusherd %s --<TAB> offers %q, want %q", cmd, got, want)
		}
		for _, f := range flags {
			if !bytes.Contains(zsh, []byte("'"+f+"[")) && !bytes.Contains(zsh, []byte("'*"+f+"[")) {
				t.Errorf("zsh: flusherd %s: no %s", cmd, f)
			}
		}
	}
	if out, err := exec.Command(needShell(t, "zsh"), "-n", "../../completions/_flusherd").CombinedOutput(); err != nil {
		t.Errorf("zsh -n: %v\n%s", err, out)
	}
}
