// Command flusherd is a userspace writeback flusher: it watches directory
// trees, keeps per-device lists of the files that hold dirty page-cache data,
// and writes that data back on a kernel-like schedule.
//
// Exit codes: 0 success; 1 the operation failed; 2 usage or configuration
// error; 3 the daemon is not reachable (sync, dirty).
package main

import (
	"fmt"
	"io"
	"os"
	"runtime/debug"

	"flusherd/internal/cli"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = ""

const usage = `flusherd - a userspace writeback flusher for chosen directory trees

Usage:
  flusherd run     [--config FILE] [--watch DIR]... [--stats-dir DIR]
                   [--log-level LEVEL] [--log-format FORMAT]
  flusherd stats   [--config FILE] [--stats-dir DIR] [--files] [DEV]
  flusherd sync    [--config FILE] [--stats-dir DIR] [--timeout D] [PATH...]
  flusherd dirty   [--config FILE] [--stats-dir DIR] [--top N] [--json] [PATH...]
  flusherd status  [--config FILE] [--stats-dir DIR] [--json] [--interval D]
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
  status   a line per tree (tracked, dirty, oldest age against the expire,
           written, errors, exposure), then a line per device
  check-config          validate a configuration file and print the
                        effective configuration
  print-default-config  print the defaults as a configuration file
  version  print the version

Run "flusherd COMMAND --help" for a command's flags. Without --config,
` + cli.DefaultConfigPath + ` is read if it exists, else the built-in defaults
apply.

Example:
  flusherd run --watch /srv/queue --stats-dir /run/flusherd

Exit codes: 0 ok, 1 operation failed, 2 usage or configuration error,
3 daemon not reachable (sync, dirty, status).
`

func main() {
	os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr))
}

// Main runs the command line args and returns the exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return cli.ExitUsage
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
	case "status":
		return cmdStatus(args[1:], stdout, stderr)
	case "check-config":
		return cmdCheckConfig(args[1:], stdout, stderr)
	case "print-default-config":
		return cmdPrintDefaultConfig(args[1:], stdout, stderr)
	case "version", "--version", "-version":
		if len(args) > 1 && (args[1] == "-h" || args[1] == "--help" || args[1] == "-help") {
			fmt.Fprint(stdout, "Usage: flusherd version\n\nPrints the version: the package's version for a packaged build; devel-<commit> for a build from a checkout, or devel when the build has no version-control information (-buildvcs=false).\n\nExample:\n  flusherd version\n")
			return cli.ExitOK
		}
		if len(args) > 1 {
			fmt.Fprintf(stderr, "flusherd version: unexpected argument %q\n", args[1])
			return cli.ExitUsage
		}
		fmt.Fprintln(stdout, "flusherd", versionString())
		return cli.ExitOK
	case "help", "-h", "--help", "-help":
		fmt.Fprint(stdout, usage)
		return cli.ExitOK
	}
	fmt.Fprintf(stderr, "flusherd: unknown command %q\nsee 'flusherd --help'\n", args[0])
	return cli.ExitUsage
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
