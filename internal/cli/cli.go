// Package cli is flusherd's command-line plumbing: flag sets whose -h and
// --help print the usage on standard output, flags allowed after
// positional arguments, flag types (a repeatable string, a duration as the
// configuration writes it, a non-empty string, one of a list) and the exit
// codes.
package cli

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"time"

	"flusherd/config"
)

// The exit codes of every command.
const (
	ExitOK          = 0
	ExitFailed      = 1 // the operation failed
	ExitUsage       = 2 // usage or configuration error
	ExitUnreachable = 3 // the daemon is not reachable (sync, dirty)
)

// MultiFlag is a repeatable string flag.
type MultiFlag []string

func (m *MultiFlag) String() string { return strings.Join(*m, ",") }

func (m *MultiFlag) Set(v string) error { *m = append(*m, v); return nil }

// Duration is a flag.Value for a duration written as in the
// configuration (config.ParseDuration), whose errors say what is wrong
// ("needs a unit") where flag.Duration says only "parse error". It is
// never negative.
type Duration time.Duration

func (d *Duration) String() string { return time.Duration(*d).String() }

func (d *Duration) Set(v string) error {
	x, err := config.ParseDuration(v)
	if err != nil {
		return err
	}
	if x < 0 {
		return fmt.Errorf("%s is negative", v)
	}
	*d = Duration(x)
	return nil
}

// NonEmpty is a string flag that refuses an empty value: "--stats-dir
// \"\"" (an unset shell variable, say) is a mistake, not a request for
// the default.
type NonEmpty struct{ P *string }

func (n NonEmpty) String() string {
	if n.P == nil {
		return ""
	}
	return *n.P
}

func (n NonEmpty) Set(v string) error {
	if v == "" {
		return errors.New("empty value")
	}
	*n.P = v
	return nil
}

// OneOf is a string flag whose value must be one of Values.
type OneOf struct {
	P      *string
	Values []string
}

func (o OneOf) String() string {
	if o.P == nil {
		return ""
	}
	return *o.P
}

func (o OneOf) Set(v string) error {
	if !slices.Contains(o.Values, v) {
		return fmt.Errorf("want one of %s", strings.Join(o.Values, ", "))
	}
	*o.P = v
	return nil
}

// PrintErr writes err after prefix, one line per problem (a
// configuration with several problems gives config.Errors, one a line).
func PrintErr(w io.Writer, prefix string, err error) {
	for _, line := range strings.Split(err.Error(), "\n") {
		fmt.Fprintf(w, "%s: %s\n", prefix, line)
	}
}

// NewFlagSet returns the flag set of command name: --help (and -h) print
// the synopsis (its first line the usage, then a description), the flags
// (shown with two dashes) and the example on stdout; a usage error prints
// one line and where to look ("see 'flusherd NAME --help'") on stderr.
func NewFlagSet(name, synopsis, example string, stdout, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	help := &helpFlag{fs: fs, out: stdout}
	help.print = func(w io.Writer) {
		fmt.Fprintf(w, "Usage: flusherd %s\n", synopsis)
		// The flags but -h and --help (said in flusherd --help and
		// flusherd(8) once, for every command).
		shown := flag.NewFlagSet(name, flag.ContinueOnError)
		var flags bytes.Buffer
		shown.SetOutput(&flags)
		fs.VisitAll(func(f *flag.Flag) {
			if _, isHelp := f.Value.(*helpFlag); !isHelp {
				shown.Var(f.Value, f.Name, f.Usage)
				shown.Lookup(f.Name).DefValue = f.DefValue
			}
		})
		shown.PrintDefaults()
		if flags.Len() > 0 {
			fmt.Fprintf(w, "\nFlags:\n%s", flagLine.ReplaceAll(flags.Bytes(), []byte("$1--")))
		}
		fmt.Fprintf(w, "\nExample:\n  %s\n", example)
	}
	fs.Var(help, "help", "print this help on standard output")
	fs.Var(help, "h", "the same as --help")
	fs.Usage = func() { fmt.Fprintf(fs.Output(), "see 'flusherd %s --help'\n", name) }
	return fs
}

// flagLine matches the start of a flag's line in flag.PrintDefaults'
// output ("  -name"), which is shown with two dashes.
var flagLine = regexp.MustCompile(`(?m)^(  )-`)

// flagName matches a flag's name in the flag package's parse errors
// ("flag provided but not defined: -x", "invalid value ... for flag -x"),
// shown with two dashes as the help shows it.
var flagName = regexp.MustCompile(`(: |flag )-([A-Za-z])`)

// helpFlag is the -h and --help flag: set, it prints the flag set's help
// on out and stops the parse (ParseArgs returns flag.ErrHelp).
type helpFlag struct {
	fs    *flag.FlagSet
	out   io.Writer
	print func(io.Writer)
	asked bool
}

func (h *helpFlag) String() string { return "" }

func (h *helpFlag) IsBoolFlag() bool { return true }

func (h *helpFlag) Set(string) error {
	h.asked = true
	h.print(h.out)
	return flag.ErrHelp
}

// ParseArgs parses args with flags allowed before, between and after the
// positional arguments (which it returns); "--" ends the flags.
func ParseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := parse(fs, args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// parse is fs.Parse, with its error printed as one line naming the
// command, and where to look, instead of the whole usage.
func parse(fs *flag.FlagSet, args []string) error {
	out := fs.Output()
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.SetOutput(out)
	if f := fs.Lookup("help"); f != nil {
		if h, ok := f.Value.(*helpFlag); ok && h.asked {
			return flag.ErrHelp
		}
	}
	if err != nil {
		fmt.Fprintf(out, "flusherd %s: %s\n", fs.Name(), flagName.ReplaceAllString(err.Error(), "$1--$2"))
		fs.Usage()
	}
	return err
}

// ParseExit is the exit code for a flag parsing error: 0 for --help.
func ParseExit(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return ExitOK
	}
	return ExitUsage
}

// ParseFlags parses args; it returns an exit code when the caller should
// stop (help, or a usage error).
func ParseFlags(fs *flag.FlagSet, args []string) (int, bool) {
	pos, err := ParseArgs(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ExitOK, true
		}
		return ExitUsage, true
	}
	if len(pos) > 0 {
		fmt.Fprintf(fs.Output(), "flusherd %s: unexpected argument %q\n", fs.Name(), pos[0])
		fs.Usage()
		return ExitUsage, true
	}
	return 0, false
}
