package main

import (
	"fmt"
	"io"
	"strings"

	"flusherd/config"
	"flusherd/internal/cli"
	"flusherd/watch"

	"golang.org/x/sys/unix"
)

// cmdCheckConfig validates a configuration file the way `run` would and
// prints the effective configuration (config.EncodeEffective), then a
// verdict line on stderr; on errors it prints every one and exits 2.
func cmdCheckConfig(args []string, stdout, stderr io.Writer) int {
	fset := cli.NewFlagSet("check-config", "check-config FILE | check-config --config FILE\n\n"+
		"Checks a configuration file as `run` would read it: the syntax, every key and\n"+
		"value, and that each watched directory exists. Prints the effective\n"+
		"configuration (defaults filled in; keys that follow another key and are\n"+
		"not set, commented out) on stdout and a verdict on stderr; on errors,\n"+
		"prints every one (file:line: key: problem) and exits 2.", "flusherd check-config /etc/flusherd/flusherd.toml", stdout, stderr)
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
	// One note per sandbox setting, naming every tree it hides.
	private := map[string][]string{} // setting -> "root" is under dir
	var settings []string
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
			if private[setting] == nil {
				settings = append(settings, setting)
			}
			private[setting] = append(private[setting], fmt.Sprintf("%q %s", w.Root, where))
		}
	}
	for _, setting := range settings {
		trees, which := private[setting], "this tree is"
		if len(trees) > 1 {
			which = "these trees are"
		}
		fmt.Fprintf(stderr, "flusherd check-config: note: %s, which the shipped systemd unit replaces with a private one (%s): under the unit %s not there; "+
			"to watch it there, set %s=no in a drop-in (/etc/systemd/system/flusherd.service.d/*.conf), which gives up that part of the sandbox\n",
			strings.Join(trees, ", "), setting, which, strings.TrimSuffix(setting, "=yes"))
	}
	if err := cfg.EncodeEffective(stdout); err != nil {
		fmt.Fprintf(stderr, "flusherd check-config: %v\n", err)
		return cli.ExitFailed
	}
	fmt.Fprintf(stderr, "flusherd check-config: configuration OK: %s\n", verdict(cfg.Watch))
	return cli.ExitOK
}

// verdict counts the trees of ws and the filesystems (st_dev) they are on,
// e.g. "2 trees on 1 device".
func verdict(ws []config.Watch) string {
	devs := map[uint64]bool{}
	for _, w := range ws {
		var st unix.Stat_t
		if unix.Stat(w.Root, &st) == nil {
			devs[st.Dev] = true
		}
	}
	plural := func(n int, one string) string {
		if n == 1 {
			return "1 " + one
		}
		return fmt.Sprintf("%d %ss", n, one)
	}
	return plural(len(ws), "tree") + " on " + plural(len(devs), "device")
}

// cmdPrintDefaultConfig prints the built-in defaults (config.WriteDefault).
func cmdPrintDefaultConfig(args []string, stdout, stderr io.Writer) int {
	fset := cli.NewFlagSet("print-default-config", "print-default-config\n\n"+
		"Prints the built-in defaults as a configuration file, with one example\n"+
		"[[watch]] entry (/var/log); check-config accepts it unchanged.", "flusherd print-default-config > flusherd.toml && flusherd check-config flusherd.toml", stdout, stderr)
	if code, stop := cli.ParseFlags(fset, args); stop {
		return code
	}
	if err := config.WriteDefault(stdout); err != nil {
		fmt.Fprintf(stderr, "flusherd print-default-config: %v\n", err)
		return cli.ExitFailed
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
