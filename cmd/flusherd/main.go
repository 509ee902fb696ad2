// Command flusherd is a userspace writeback flusher: it watches directory
// trees, keeps per-device lists of the files that hold dirty page-cache data,
// and writes that data back on a kernel-like schedule.
//
// Exit codes: 0 success; 1 the operation failed; 2 usage or configuration
// error; 3 the daemon is not reachable (sync, dirty).
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"time"

	"flusherd/config"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = ""

const defaultConfigPath = "/etc/flusherd/flusherd.toml"

const (
	exitOK     = 0
	exitFailed = 1
	exitUsage  = 2
)

const usage = `flusherd - a userspace writeback flusher for chosen directory trees

Usage:
  flusherd run     [--config FILE] [--watch DIR]... [--stats-dir DIR]
  flusherd stats   [--config FILE] [--stats-dir DIR] [--files] [DEV]
  flusherd sync    [--config FILE] [--stats-dir DIR] [--timeout D] [PATH...]
  flusherd dirty   [--config FILE] [--stats-dir DIR] [--top N] [--json]
  flusherd check-config FILE
  flusherd print-default-config
  flusherd version  (or --version)

Commands:
  run      watch the trees and write their dirty data back (foreground;
           logs to stderr; SIGHUP reloads the configuration; SIGTERM/SIGINT
           write everything back and exit)
  stats    print every device's statistics (or DEV's), live from the
           daemon, or from the stats files (<stats.dir>/bdi/<dev>/stats)
           when it is not running or with --files
  sync     integrity writeback through the running daemon (its socket,
           <stats.dir>/flusherd.sock), ahead of background writeback, and
           wait: the named files, the tracked files under a named
           directory, or with no PATH every tracked file; names each file
           that failed
  dirty    the tracked files, oldest first: age, device, list, dirty and
           writeback pages, retries, last error, path
  check-config          validate a configuration file and print the
                        effective configuration
  print-default-config  print the defaults as a configuration file
  version  print the version

Run "flusherd COMMAND --help" for a command's flags. Without --config,
` + defaultConfigPath + ` is read if it exists, else the built-in defaults
apply.

Example:
  flusherd run --watch /srv/queue --stats-dir /run/flusherd

Exit codes: 0 ok, 1 operation failed, 2 usage or configuration error,
3 daemon not reachable (sync, dirty).
`

func main() {
	os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr))
}

// Main runs the command line args and returns the exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	switch args[0] {
	case "run":
		return cmdRun(args[1:], stdout, stderr)
	case "stats":
		return cmdStats(args[1:], stdout, stderr)
	case "sync":
		return cmdSync(args[1:], stdout, stderr)
	case "dirty":
		return cmdDirty(args[1:], stdout, stderr)
	case "check-config":
		return cmdCheckConfig(args[1:], stdout, stderr)
	case "print-default-config":
		return cmdPrintDefaultConfig(args[1:], stdout, stderr)
	case "version", "--version", "-version":
		if len(args) > 1 && (args[1] == "-h" || args[1] == "--help" || args[1] == "-help") {
			fmt.Fprint(stdout, "Usage: flusherd version\n\nPrints the version: the package's version for a packaged build; devel-<commit> for a build from a checkout, or devel when the build has no version-control information (-buildvcs=false).\n\nExample:\n  flusherd version\n")
			return exitOK
		}
		if len(args) > 1 {
			fmt.Fprintf(stderr, "flusherd version: unexpected argument %q\n", args[1])
			return exitUsage
		}
		fmt.Fprintln(stdout, "flusherd", versionString())
		return exitOK
	case "help", "-h", "--help", "-help":
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	fmt.Fprintf(stderr, "flusherd: unknown command %q\n\n%s", args[0], usage)
	return exitUsage
}

func versionString() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		rev, dirty := "", false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if rev != "" {
			if len(rev) > 12 {
				rev = rev[:12]
			}
			if dirty {
				rev += "-dirty"
			}
			return "devel-" + rev
		}
	}
	return "devel"
}

// multiFlag is a repeatable string flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// durationFlag is a flag.Value for a duration written as in the
// configuration (config.ParseDuration), whose errors say what is wrong
// ("needs a unit") where flag.Duration says only "parse error". It is
// never negative.
type durationFlag time.Duration

func (d *durationFlag) String() string { return time.Duration(*d).String() }
func (d *durationFlag) Set(v string) error {
	x, err := config.ParseDuration(v)
	if err != nil {
		return err
	}
	if x < 0 {
		return fmt.Errorf("%s is negative", v)
	}
	*d = durationFlag(x)
	return nil
}

// nonEmpty is a string flag that refuses an empty value: "--stats-dir
// \"\"" (an unset shell variable, say) is a mistake, not a request for
// the default.
type nonEmpty struct{ p *string }

func (n nonEmpty) String() string {
	if n.p == nil {
		return ""
	}
	return *n.p
}

func (n nonEmpty) Set(v string) error {
	if v == "" {
		return errors.New("empty value")
	}
	*n.p = v
	return nil
}

// commonFlags are the flags shared by the commands that read the config.
type commonFlags struct {
	config   string
	statsDir string
}

// printErr writes err after prefix, one line per problem (a
// configuration with several problems gives config.Errors, one a line).
func printErr(w io.Writer, prefix string, err error) {
	for _, line := range strings.Split(err.Error(), "\n") {
		fmt.Fprintf(w, "%s: %s\n", prefix, line)
	}
}

// readsFile reports whether loadConfig reads a configuration file: --config
// was given, or the default file exists.
func (c *commonFlags) readsFile() bool {
	if c.config != "" {
		return true
	}
	_, err := os.Stat(defaultConfigPath)
	return err == nil
}

func (c *commonFlags) register(fs *flag.FlagSet) {
	fs.Var(nonEmpty{&c.config}, "config", "configuration `file` (default "+defaultConfigPath+" if it exists)")
	fs.Var(nonEmpty{&c.statsDir}, "stats-dir", "`directory` of the stats files and the control socket; overrides stats.dir (default /run/flusherd)")
}

func newFlagSet(name, synopsis, example string, stdout, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	// -h and --help print the usage on stdout (it was asked for, as with
	// flusherd --help); a usage error prints it on stderr.
	help := &helpFlag{fs: fs, out: stdout}
	fs.Var(help, "help", "print this help on standard output")
	fs.Var(help, "h", "the same as --help")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: flusherd %s\n", synopsis)
		// The flags but -h and --help (said in flusherd --help and
		// flusherd(8) once, for every command).
		shown := flag.NewFlagSet(name, flag.ContinueOnError)
		shown.SetOutput(fs.Output())
		fs.VisitAll(func(f *flag.Flag) {
			if _, isHelp := f.Value.(*helpFlag); !isHelp {
				shown.Var(f.Value, f.Name, f.Usage)
				shown.Lookup(f.Name).DefValue = f.DefValue
			}
		})
		n := 0
		shown.VisitAll(func(*flag.Flag) { n++ })
		if n > 0 {
			fmt.Fprintf(fs.Output(), "\nFlags:\n")
			shown.PrintDefaults()
		}
		fmt.Fprintf(fs.Output(), "\nExample:\n  %s\n", example)
	}
	return fs
}

// helpFlag is the -h and --help flag: set, it prints the flag set's usage
// on out and stops the parse (parseArgs returns flag.ErrHelp).
type helpFlag struct {
	fs    *flag.FlagSet
	out   io.Writer
	asked bool
}

func (h *helpFlag) String() string   { return "" }
func (h *helpFlag) IsBoolFlag() bool { return true }
func (h *helpFlag) Set(string) error {
	h.asked = true
	h.fs.SetOutput(h.out)
	h.fs.Usage()
	h.fs.SetOutput(io.Discard) // (the parse error that follows says nothing)
	return flag.ErrHelp
}

// parseArgs parses args with flags allowed before, between and after the
// positional arguments (which it returns); "--" ends the flags.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if f := fs.Lookup("help"); f != nil {
				if h, ok := f.Value.(*helpFlag); ok && h.asked {
					return nil, flag.ErrHelp
				}
			}
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

// parseExit is the exit code for a flag parsing error: 0 for --help.
func parseExit(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	return exitUsage
}

// parseFlags parses args; it returns an exit code when the caller should
// stop (help, or a usage error).
func parseFlags(fs *flag.FlagSet, args []string) (int, bool) {
	pos, err := parseArgs(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK, true
		}
		return exitUsage, true
	}
	if len(pos) > 0 {
		fmt.Fprintf(fs.Output(), "flusherd %s: unexpected argument %q\n", fs.Name(), pos[0])
		fs.Usage()
		return exitUsage, true
	}
	return 0, false
}

// loadConfig reads the configuration: --config, else the default path if it
// exists, else the defaults. It applies --stats-dir and the extra watches.
func loadConfig(c commonFlags, watches []string) (*config.Config, error) {
	return loadConfigWith(config.Load, c, watches)
}

// loadClientConfig is loadConfig for the client commands (stats, dirty,
// sync): the watch paths are not looked at (config.LoadValues), so they
// work while a watched filesystem is dead, which is when they are needed.
func loadClientConfig(c commonFlags) (*config.Config, error) {
	return loadConfigWith(config.LoadValues, c, nil)
}

func loadConfigWith(load func(string) (*config.Config, error), c commonFlags, watches []string) (*config.Config, error) {
	var cfg *config.Config
	switch {
	case c.config != "":
		var err error
		if cfg, err = load(c.config); err != nil {
			return nil, err
		}
	default:
		if _, err := os.Stat(defaultConfigPath); err == nil {
			if cfg, err = load(defaultConfigPath); err != nil {
				return nil, err
			}
		} else {
			cfg = config.Default()
		}
	}
	if c.statsDir != "" {
		abs, err := filepath.Abs(c.statsDir)
		if err != nil {
			return nil, err
		}
		cfg.Stats.Dir = abs
	}
	for _, w := range watches {
		if w == "" {
			return nil, errors.New("--watch: empty directory name")
		}
		abs, err := filepath.Abs(w)
		if err != nil {
			return nil, err
		}
		// A directory the file watches already is an error of
		// Validate's ("already watched"), not silently dropped: the
		// two entries may differ in mode and expiry.
		cfg.Watch = append(cfg.Watch, config.Watch{
			Path:      abs,
			Recursive: true,
			Mode:      config.ModeWriteback,
			Expire:    cfg.Writeback.DirtyExpireInterval,
			Flag:      "--watch",
		})
	}
	return cfg, nil
}
