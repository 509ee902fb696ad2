package watch

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestBudgetErr: EMFILE from making an inotify instance or a fanotify group
// names the sysctl of the budget, its value and how to raise it, and wraps
// the errno; another error is left as it is.
func TestBudgetErr(t *testing.T) {
	err := budgetErr(fmt.Errorf("inotify_init1: %w", unix.EMFILE), inotifyInstances)
	if !errors.Is(err, unix.EMFILE) || !strings.Contains(err.Error(), "fs.inotify.max_user_instances (") ||
		!strings.Contains(err.Error(), "sysctl fs.inotify.max_user_instances=N") {
		t.Errorf("EMFILE: %v", err)
	}
	if err := budgetErr(unix.EINVAL, fanotifyGroups); err != unix.EINVAL {
		t.Errorf("EINVAL: %v, want it as it is", err)
	}
}
