package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
)

func cmdStats(args []string, stdout, stderr io.Writer) int {
	fset := newFlagSet("stats", "stats [--config FILE] [--stats-dir DIR]", "flusherd stats --stats-dir /run/flusherd", stderr)
	var c commonFlags
	c.register(fset)
	if code, stop := parseFlags(fset, args); stop {
		return code
	}
	cfg, err := loadConfig(c, nil)
	if err != nil {
		fmt.Fprintf(stderr, "flusherd stats: %v\n", err)
		return exitUsage
	}
	files, err := filepath.Glob(filepath.Join(cfg.Stats.Dir, "bdi", "*", "stats"))
	if err != nil {
		fmt.Fprintf(stderr, "flusherd stats: %v\n", err)
		return exitFailed
	}
	if len(files) == 0 {
		if _, err := os.Stat(cfg.Stats.Dir); errors.Is(err, fs.ErrNotExist) {
			fmt.Fprintf(stderr, "flusherd stats: %s does not exist: is flusherd running with this stats dir?\n", cfg.Stats.Dir)
			return exitFailed
		}
		fmt.Fprintf(stderr, "flusherd stats: no device has stats in %s yet (no file has been dirtied)\n", cfg.Stats.Dir)
		return exitOK
	}
	slices.Sort(files)
	for i, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			fmt.Fprintf(stderr, "flusherd stats: %v\n", err)
			return exitFailed
		}
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		fmt.Fprintf(stdout, "==> bdi/%s <==\n%s", filepath.Base(filepath.Dir(f)), data)
	}
	return exitOK
}
