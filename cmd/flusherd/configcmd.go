package main

import (
	"bytes"
	"fmt"
	"io"
	"strings"

	"flusherd/config"
	"flusherd/internal/cli"
	"flusherd/tree"
	"flusherd/watch"
)

// cmdCheckConfig validates a configuration file the way `run` would and
// prints the effective configuration (defaults filled in) as TOML.
func cmdCheckConfig(args []string, stdout, stderr io.Writer) int {
	fset := cli.NewFlagSet("check-config", "check-config FILE | check-config --config FILE", "flusherd check-config /etc/flusherd/flusherd.toml", stdout, stderr)
	file := fset.String("config", "", "the configuration `file` (as the other commands take it; or give it as the argument)")
	pos, err := cli.ParseArgs(fset, args)
	if err != nil {
		return cli.ParseExit(err)
	}
	if *file != "" {
		pos = append(pos, *file)
	}
	if len(pos) != 1 {
		fmt.Fprintln(stderr, "flusherd check-config: name one configuration file")
		fset.Usage()
		return cli.ExitUsage
	}
	cfg, err := config.Load(pos[0])
	if err == nil {
		err = cfg.Validate()
	}
	if err != nil {
		cli.PrintErr(stderr, "flusherd check-config", err)
		return cli.ExitUsage
	}
	for _, n := range cfg.Notes() {
		fmt.Fprintf(stderr, "flusherd check-config: note: %s\n", n)
	}
	if len(cfg.Watch) == 0 {
		fmt.Fprintln(stderr, "flusherd check-config: note: no [[watch]] entries; the daemon will start idle until one is added and the configuration reloaded")
	}
	for _, w := range cfg.Watch {
		if kind, ok := watch.NoWriteback(w.Root); ok {
			fmt.Fprintf(stderr, "flusherd check-config: note: %q is on %s, a filesystem without writeback: nothing there is ever written back\n", w.Root, kind)
			continue // (under the unit or not, nothing to do there)
		}
		if d, setting, ok := privateDir(w.Root); ok {
			where := "is under " + d
			if w.Root == d {
				where = "is " + d
			}
			fmt.Fprintf(stderr, "flusherd check-config: note: %q %s, which the shipped systemd unit replaces with a private one (%s): under the unit this tree is not there; "+
				"to watch it there, set %s=no in a drop-in (/etc/systemd/system/flusherd.service.d/*.conf), which gives up that part of the sandbox\n",
				w.Root, where, setting, strings.TrimSuffix(setting, "=yes"))
		}
	}
	if err := cfg.Encode(stdout); err != nil {
		fmt.Fprintf(stderr, "flusherd check-config: %v\n", err)
		return cli.ExitFailed
	}
	return cli.ExitOK
}

// cmdPrintDefaultConfig prints the built-in defaults as a configuration
// file that check-config accepts unchanged: its one [[watch]] is /var/log,
// which every Linux system has. Keys whose default follows another key
// (max_pause, a tree's expire) are printed commented out, so that changing
// the key they follow changes them too.
func cmdPrintDefaultConfig(args []string, stdout, stderr io.Writer) int {
	fset := cli.NewFlagSet("print-default-config", "print-default-config", "flusherd print-default-config > flusherd.toml && flusherd check-config flusherd.toml", stdout, stderr)
	if code, stop := cli.ParseFlags(fset, args); stop {
		return code
	}
	cfg := config.Default()
	cfg.Watch = []config.Watch{{Tree: tree.Tree{Root: "/var/log", Recursive: true, Mode: tree.ModeWriteback, Expire: cfg.Writeback.DirtyExpireInterval}}}
	fmt.Fprintln(stdout, "# flusherd's built-in defaults, with one [[watch]] entry as an example (the\n# defaults watch nothing): replace it with your trees. Durations need a\n# unit (\"500ms\", \"5s\"); sizes take B, KiB, MiB or GiB. Commented keys\n# follow another key unless set.")
	var buf bytes.Buffer
	if err := cfg.Encode(&buf); err != nil {
		fmt.Fprintf(stderr, "flusherd print-default-config: %v\n", err)
		return cli.ExitFailed
	}
	follows := map[string]string{
		"writeback.max_pause": "dirty_writeback_interval",
		"watch.expire":        "[writeback] dirty_expire_interval",
	}
	table := ""
	for _, line := range strings.SplitAfter(buf.String(), "\n") {
		switch t := strings.TrimSpace(line); {
		case strings.HasPrefix(t, "["):
			table = strings.Trim(t, "[]")
		case strings.Contains(t, " = "):
			key, _, _ := strings.Cut(t, " = ")
			if f, ok := follows[table+"."+key]; ok {
				fmt.Fprintf(stdout, "# default: as %s\n# %s", f, line)
				continue
			}
		}
		fmt.Fprint(stdout, line)
	}
	return cli.ExitOK
}

// privateDir reports whether path is under a directory the shipped unit
// gives the daemon its own copy of (systemd.exec(5)), and the setting
// that does: /tmp and /var/tmp (PrivateTmp=yes: empty), /dev
// (PrivateDevices=yes: the pseudo devices only, /dev/shm empty).
func privateDir(path string) (dir, setting string, ok bool) {
	for _, p := range []struct{ dir, setting string }{
		{"/tmp", "PrivateTmp=yes"}, {"/var/tmp", "PrivateTmp=yes"}, {"/dev", "PrivateDevices=yes"},
	} {
		if path == p.dir || strings.HasPrefix(path, p.dir+"/") {
			return p.dir, p.setting, true
		}
	}
	return "", "", false
}
