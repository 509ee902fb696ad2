package cli

import (
	"bytes"
	"io"
	"slices"
	"testing"
)

// TestFlagsAfterArguments: flags may follow positional arguments; "--"
// ends the flags.
func TestFlagsAfterArguments(t *testing.T) {
	fs := NewFlagSet("x", "x", "x", io.Discard, io.Discard)
	n := fs.Int("n", 0, "")
	b := fs.Bool("b", false, "")
	for _, tc := range []struct {
		args []string
		pos  []string
		n    int
		b    bool
	}{
		{[]string{"a", "--n", "3", "b"}, []string{"a", "b"}, 3, false},
		{[]string{"-b", "a"}, []string{"a"}, 0, true},
		{[]string{"a", "--", "-b", "--n"}, []string{"a", "-b", "--n"}, 0, false},
		{nil, nil, 0, false},
	} {
		*n, *b = 0, false
		pos, err := ParseArgs(fs, tc.args)
		if err != nil || !slices.Equal(pos, tc.pos) || *n != tc.n || *b != tc.b {
			t.Errorf("ParseArgs(%q) = %q, %v, n=%d b=%v; want %q, n=%d b=%v", tc.args, pos, err, *n, *b, tc.pos, tc.n, tc.b)
		}
	}
}

// TestOneOf: a OneOf flag takes a listed value; any other is a usage
// error (exit 2) that names the value and the list.
func TestOneOf(t *testing.T) {
	var stderr bytes.Buffer
	var level string
	fs := NewFlagSet("x", "x", "x", io.Discard, &stderr)
	fs.Var(OneOf{P: &level, Values: []string{"debug", "info"}}, "log-level", "")
	if code, stop := ParseFlags(fs, []string{"--log-level", "debug"}); stop || level != "debug" {
		t.Errorf("--log-level debug: exit %d, stop %v, level %q", code, stop, level)
	}
	code, stop := ParseFlags(fs, []string{"--log-level=verbose"})
	want := "flusherd x: invalid value \"verbose\" for flag --log-level: want one of debug, info\nsee 'flusherd x --help'\n"
	if !stop || code != ExitUsage || level != "debug" || stderr.String() != want {
		t.Errorf("--log-level=verbose: exit %d, stop %v, level %q, stderr:\n%s\nwant %q", code, stop, level, stderr.String(), want)
	}
}
