package main

import (
	"fmt"
	"os"
	"strings"
)

// holdKernelFlusher raises vm.dirty_background_bytes and vm.dirty_bytes to
// the given byte counts and vm.dirty_expire_centisecs to an hour, so that
// the kernel's own flusher leaves dirty files alone during a run; restore
// puts back the values it found (also on error).
func holdKernelFlusher(background, dirty int64) (restore func(), err error) {
	var undo []func()
	restore = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	for _, sc := range [][2]string{{"dirty_background_bytes", fmt.Sprint(background)}, {"dirty_bytes", fmt.Sprint(dirty)}, {"dirty_expire_centisecs", "360000"}} {
		r, err := sysctl(sc[0], sc[1])
		if err != nil {
			restore()
			return nil, err
		}
		undo = append(undo, r)
	}
	return restore, nil
}

// sysctl sets a vm sysctl and returns a function that restores it. The
// *_bytes knobs and their *_ratio twins exclude each other (writing one
// zeroes the other, and 0 is not a valid *_bytes), so for those the one
// that was in force is what is written back.
func sysctl(name, value string) (func(), error) {
	p := "/proc/sys/vm/" + name
	old, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	restoreName, restoreValue := name, old
	if twin, ok := strings.CutSuffix(name, "_bytes"); ok && strings.TrimSpace(string(old)) == "0" {
		restoreName = twin + "_ratio"
		if restoreValue, err = os.ReadFile("/proc/sys/vm/" + restoreName); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
		return nil, err
	}
	return func() {
		if err := os.WriteFile("/proc/sys/vm/"+restoreName, restoreValue, 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "flusherd-bench: restoring vm.%s: %v\n", restoreName, err)
		}
	}, nil
}
