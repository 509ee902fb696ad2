package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// maxStatsFile bounds what is read of one stats file, in bytes.
const maxStatsFile = 64 << 10

// readStatsFile reads a stats file without following a symlink or blocking
// on a FIFO, and only if it is a regular file of sane size.
func readStatsFile(path string) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	return io.ReadAll(io.LimitReader(f, maxStatsFile))
}

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
	bdiDir := filepath.Join(cfg.Stats.Dir, "bdi")
	entries, err := os.ReadDir(bdiDir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if _, serr := os.Stat(cfg.Stats.Dir); errors.Is(serr, fs.ErrNotExist) {
			fmt.Fprintf(stderr, "flusherd stats: %s does not exist: is flusherd running with this stats dir?\n", cfg.Stats.Dir)
			return exitFailed
		}
		fmt.Fprintf(stderr, "flusherd stats: no device has stats in %s yet (no file has been dirtied)\n", cfg.Stats.Dir)
		return exitOK
	case err != nil:
		fmt.Fprintf(stderr, "flusherd stats: %v\n", err)
		return exitFailed
	}
	shown := 0
	for _, e := range entries {
		data, err := readStatsFile(filepath.Join(bdiDir, e.Name(), "stats"))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			fmt.Fprintf(stderr, "flusherd stats: %v\n", err)
			return exitFailed
		}
		if shown > 0 {
			fmt.Fprintln(stdout)
		}
		shown++
		name := strconv.Quote(e.Name()) // a device name is printed escaped
		fmt.Fprintf(stdout, "==> bdi/%s <==\n%s", name[1:len(name)-1], data)
	}
	if shown == 0 {
		fmt.Fprintf(stderr, "flusherd stats: no device has stats in %s yet (no file has been dirtied)\n", cfg.Stats.Dir)
	}
	return exitOK
}
