// Package sysfs reads the parts of /proc and /sys that flusherd needs:
// backing-device (bdi) names, dirty thresholds from /proc/vmstat and the
// kernel's own per-bdi writeback statistics from debugfs.
//
// All reads go through an FS, which holds the roots of procfs and sysfs so
// that tests can point it at fixtures (in the style of prometheus/procfs).
package sysfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// ErrFormat is wrapped by errors about kernel files whose content is not in
// the expected format (unparsable numbers, missing keys, malformed lines).
var ErrFormat = errors.New("unexpected format")

// FS holds the roots of procfs (Proc, normally "/proc") and sysfs (Sys,
// normally "/sys"). Debugfs is expected at <Sys>/kernel/debug.
//
// The zero value is not usable: its methods return an error wrapping
// fs.ErrInvalid. Use Default or New.
type FS struct {
	Proc, Sys string
}

// Default returns the FS of the running system: {"/proc", "/sys"}.
func Default() FS { return FS{Proc: "/proc", Sys: "/sys"} }

// New returns an FS rooted at proc and sys after checking that both are
// directories. The error wraps the os.Stat error (e.g. fs.ErrNotExist) or
// fs.ErrInvalid when a root is empty or not a directory.
func New(proc, sys string) (FS, error) {
	for _, root := range []string{proc, sys} {
		if root == "" {
			return FS{}, fmt.Errorf("sysfs: empty root: %w", fs.ErrInvalid)
		}
		fi, err := os.Stat(root)
		if err != nil {
			return FS{}, fmt.Errorf("sysfs: root: %w", err)
		}
		if !fi.IsDir() {
			return FS{}, fmt.Errorf("sysfs: root %s is not a directory: %w", root, fs.ErrInvalid)
		}
	}
	return FS{Proc: proc, Sys: sys}, nil
}

// PageSize returns the system page size in bytes (os.Getpagesize). Counters
// in /proc/vmstat, including the dirty thresholds, are in pages.
func PageSize() int { return os.Getpagesize() }

func (fs FS) procPath(elem ...string) (string, error) {
	if fs.Proc == "" {
		return "", fmt.Errorf("sysfs: FS has no Proc root (zero value?): %w", errInvalid)
	}
	return filepath.Join(append([]string{fs.Proc}, elem...)...), nil
}

func (fs FS) sysPath(elem ...string) (string, error) {
	if fs.Sys == "" {
		return "", fmt.Errorf("sysfs: FS has no Sys root (zero value?): %w", errInvalid)
	}
	return filepath.Join(append([]string{fs.Sys}, elem...)...), nil
}

// errInvalid is fs.ErrInvalid; the alias avoids the receiver name "fs"
// shadowing the io/fs package inside methods.
var errInvalid = fs.ErrInvalid

// validName reports whether name can be used as a single path element below
// /sys/class/bdi or /sys/kernel/debug/bdi.
func validName(name string) bool {
	return name != "" && name != "." && name != ".." && !strings.ContainsAny(name, "/\x00")
}
