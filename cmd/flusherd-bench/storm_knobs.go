package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
)

// knobStack holds the undo functions of the kernel settings the bench
// changed (the blkio throttle, sysctls, wbt_lat_usec). Each runs once:
// from its run's defer, or from restoreAll (a signal, or the end), which
// undoes the outstanding ones newest first.
type knobStack struct {
	mu    sync.Mutex
	items []*knob
}

type knob struct {
	name string
	undo func() error
}

func (s *knobStack) push(name string, undo func() error) *knob {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := &knob{name: name, undo: undo}
	s.items = append(s.items, k)
	return k
}

// restore undoes k if it is still outstanding; false if that failed.
func (s *knobStack) restore(k *knob) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := slices.Index(s.items, k)
	if i < 0 {
		return true
	}
	s.items = slices.Delete(s.items, i, i+1)
	return runUndo(k)
}

// restoreAll undoes every outstanding setting, newest first; false if one
// failed.
func (s *knobStack) restoreAll() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	ok := true
	for _, k := range slices.Backward(s.items) {
		ok = runUndo(k) && ok
	}
	s.items = nil
	return ok
}

func runUndo(k *knob) bool {
	if err := k.undo(); err != nil {
		fmt.Fprintf(os.Stderr, "flusherd-bench storm: restoring %s: %v\n", k.name, err)
		return false
	}
	return true
}

// throttleOf returns the write_bps rule for majmin in a
// blkio.throttle.write_bps_device file ("0" if there is none).
func throttleOf(data []byte, majmin string) string {
	for line := range strings.Lines(string(data)) {
		if f := strings.Fields(line); len(f) == 2 && f[0] == majmin {
			return f[1]
		}
	}
	return "0"
}

// setThrottle limits writes to majmin to rate bytes per second in the root
// blkio cgroup; the knob puts back the rule it found (none: "0").
func setThrottle(ks *knobStack, majmin string, rate int64) (*knob, error) {
	old, err := os.ReadFile(blkioWriteBPS)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", blkioWriteBPS, err)
	}
	prev := throttleOf(old, majmin)
	k := ks.push("blkio write_bps_device "+majmin, func() error {
		return os.WriteFile(blkioWriteBPS, []byte(majmin+" "+prev), 0o644)
	})
	if err := os.WriteFile(blkioWriteBPS, fmt.Appendf(nil, "%s %d", majmin, rate), 0o644); err != nil {
		ks.restore(k)
		return nil, fmt.Errorf("%s: %w", blkioWriteBPS, err)
	}
	return k, nil
}

// setSysfs writes value to a sysfs or procfs file; the knob writes back
// what was there.
func setSysfs(ks *knobStack, path, value string) (*knob, error) {
	old, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	old = bytes.TrimSpace(old)
	k := ks.push(path, func() error { return os.WriteFile(path, old, 0o644) })
	if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
		ks.restore(k)
		return nil, err
	}
	return k, nil
}

func wbtPath(device string) string {
	return "/sys/block/" + filepath.Base(device) + "/queue/wbt_lat_usec"
}

var vmNames = []string{"dirty_background_bytes", "dirty_background_ratio", "dirty_bytes", "dirty_ratio", "dirty_expire_centisecs", "dirty_writeback_centisecs"}

func readVM() map[string]string {
	m := map[string]string{}
	for _, n := range vmNames {
		b, err := os.ReadFile("/proc/sys/vm/" + n)
		if err != nil {
			m[n] = "?"
			continue
		}
		m[n] = strings.TrimSpace(string(b))
	}
	return m
}
