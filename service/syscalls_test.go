package service

import (
	"errors"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCachestatErr: the start-up check's verdicts: ENOSYS names the kernel
// version and the filter, EPERM and EACCES the filter; success and the
// file's own errors pass.
func TestCachestatErr(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want []string
	}{
		{nil, nil},
		{unix.EBADF, nil},
		{unix.ENOSYS, []string{"cachestat(2)", "ENOSYS", "older than 6.5", "seccomp", "deploy/seccomp/flusherd.json"}},
		{unix.EPERM, []string{"cachestat(2)", "operation not permitted", "seccomp", "SystemCallFilter="}},
		{unix.EACCES, []string{"cachestat(2)", "seccomp"}},
	} {
		err := cachestatErr(tc.err)
		if (err != nil) != (tc.want != nil) {
			t.Errorf("%v: %v", tc.err, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v: %q does not say %q", tc.err, err, w)
			}
		}
		if err != nil && tc.err != unix.ENOSYS && !errors.Is(err, tc.err) {
			t.Errorf("%v: the verdict does not wrap the errno", tc.err)
		}
	}
	if err := CheckCachestat(); err != nil {
		t.Errorf("on this machine: %v", err)
	}
}
