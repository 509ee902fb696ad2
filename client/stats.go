package client

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"flusherd/control"
	"flusherd/internal/cli"
)

// Stats prints every device's statistics (or dev's, a bdi name) and
// returns the exit code: live from the daemon whose stats directory is
// statsDir, or from its stats files when it does not answer or with
// filesOnly.
func Stats(statsDir, dev string, filesOnly bool, stdout, stderr io.Writer) int {
	if !filesOnly {
		if code, done := statsLive(statsDir, dev, stdout, stderr); done {
			return code
		}
	}
	return statsFiles(statsDir, dev, stdout, stderr)
}

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

// statsLive prints the running daemon's statistics (all devices, or dev's)
// and its exit code; done is false when the daemon did not answer (said
// on stderr), for the stats files to be read instead.
func statsLive(statsDir, dev string, stdout, stderr io.Writer) (code int, done bool) {
	resp, err := control.Call(control.SocketPath(statsDir), control.Request{Op: "stats"}, 10*time.Second)
	if err == nil && resp.OK {
		shown := 0
		for _, d := range resp.Devices {
			if dev != "" && d.Bdi != dev {
				continue
			}
			if shown > 0 {
				fmt.Fprintln(stdout)
			}
			shown++
			name := strconv.Quote(d.Bdi)
			fmt.Fprintf(stdout, "==> bdi/%s <==\n%s", name[1:len(name)-1], d.Stats)
		}
		if shown == 0 {
			if dev != "" {
				names := make([]string, 0, len(resp.Devices))
				for _, d := range resp.Devices {
					names = append(names, strconv.Quote(d.Bdi))
				}
				has := "it has none yet (no file has been dirtied)"
				if len(names) > 0 {
					has = "it has " + strings.Join(names, ", ") + " (major:minor, as in /sys/kernel/debug/bdi)"
				}
				fmt.Fprintf(stderr, "flusherd stats: the daemon has no device %s; %s\n", strconv.Quote(dev), has)
				return cli.ExitFailed, true
			}
			fmt.Fprintln(stderr, "flusherd stats: no device yet (no file has been dirtied)")
		}
		return cli.ExitOK, true
	}
	if err != nil && !errors.Is(err, control.ErrUnreachable) {
		fmt.Fprintf(stderr, "flusherd stats: asking the daemon: %v; reading the stats files\n", err)
	} else if _, serr := os.Stat(statsDir); errors.Is(err, control.ErrUnreachable) && serr == nil {
		// Say that the figures are not live: a stopped daemon's
		// files stay, with its last figures. (A stats dir that
		// does not exist is said by statsFiles, alone.)
		fmt.Fprintf(stderr, "flusherd stats: the daemon does not answer on %s; showing the stats files as it last wrote them\n", control.SocketPath(statsDir))
	}
	return 0, false
}

// statsFiles prints the statistics from the stats files in statsDir (all
// devices, or dev's) and returns the exit code.
func statsFiles(statsDir, dev string, stdout, stderr io.Writer) int {
	bdiDir := filepath.Join(statsDir, "bdi")
	entries, err := os.ReadDir(bdiDir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if _, serr := os.Stat(statsDir); errors.Is(serr, fs.ErrNotExist) {
			fmt.Fprintf(stderr, "flusherd stats: %s does not exist: is flusherd running with this stats dir?\n", statsDir)
			return cli.ExitFailed
		}
		fmt.Fprintf(stderr, "flusherd stats: no device has stats in %s yet (no file has been dirtied)\n", statsDir)
		return cli.ExitOK
	case err != nil:
		fmt.Fprintf(stderr, "flusherd stats: %v\n", err)
		return cli.ExitFailed
	}
	shown := 0
	for _, e := range entries {
		if dev != "" && e.Name() != dev {
			continue
		}
		data, err := readStatsFile(filepath.Join(bdiDir, e.Name(), "stats"))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			fmt.Fprintf(stderr, "flusherd stats: %v\n", err)
			return cli.ExitFailed
		}
		if shown > 0 {
			fmt.Fprintln(stdout)
		}
		shown++
		name := strconv.Quote(e.Name()) // a device name is printed escaped
		fmt.Fprintf(stdout, "==> bdi/%s <==\n%s", name[1:len(name)-1], data)
	}
	if shown == 0 {
		if dev != "" {
			fmt.Fprintf(stderr, "flusherd stats: no stats file for device %s in %s\n", strconv.Quote(dev), statsDir)
			return cli.ExitFailed
		}
		fmt.Fprintf(stderr, "flusherd stats: no device has stats in %s yet (no file has been dirtied)\n", statsDir)
	}
	return cli.ExitOK
}
