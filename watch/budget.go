package watch

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// budgetErr names the kernel budget behind err when it is one that every
// process of the user shares: the inotify instances, or the fanotify
// groups (EMFILE from inotify_init1 or fanotify_init), with the sysctl's
// value and how to raise it; other errors are returned as they are.
func budgetErr(err error, sysctl string) error {
	if !errors.Is(err, unix.EMFILE) {
		return err
	}
	v := "?"
	if b, rerr := os.ReadFile("/proc/sys/" + strings.ReplaceAll(sysctl, ".", "/")); rerr == nil {
		v = strings.TrimSpace(string(b))
	}
	return fmt.Errorf("%w: %s (%s) is used up, by this user's other processes or by this one's file descriptors; raise it (sysctl %s=N)", err, sysctl, v, sysctl)
}

// The budgets budgetErr names.
const (
	inotifyInstances = "fs.inotify.max_user_instances"
	fanotifyGroups   = "fs.fanotify.max_user_groups"
)
