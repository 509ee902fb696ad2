package watch

import (
	"os"
	"strings"
	"testing"
)

// TestWatchLimit: in the initial user namespace both files hold one
// value, and the limit is named by its sysctl there.
func TestWatchLimit(t *testing.T) {
	b, err := os.ReadFile("/proc/sys/fs/inotify/max_user_watches")
	if err != nil {
		t.Skipf("no inotify limit to read: %v", err)
	}
	ns, err := os.ReadFile("/proc/self/uid_map")
	if err != nil || strings.Fields(string(ns))[2] != "4294967295" {
		t.Skip("not in the initial user namespace")
	}
	name, value := watchLimit()
	if want := strings.TrimSpace(string(b)); name != "fs.inotify.max_user_watches" || value != want {
		t.Errorf("watchLimit() = %q, %q; want fs.inotify.max_user_watches, %q", name, value, want)
	}
}
