package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"flusherd/internal/cli"
	"flusherd/internal/testfs"
)

// seccompEnv, set to an errno number, makes the test binary a launcher
// (seccompExec, from TestMain): it refuses cachestat(2) with that errno in
// a seccomp filter and executes its arguments, as a container runtime's
// profile or a SystemCallFilter= would.
const seccompEnv = "FLUSHERD_TEST_DENY_CACHESTAT"

// seccompExec installs a filter that answers cachestat(2) with the errno
// in seccompEnv and executes os.Args[1:] under it; it does not return.
func seccompExec() {
	errno, err := strconv.Atoi(os.Getenv(seccompEnv))
	if err != nil || runtime.GOARCH != "amd64" {
		fmt.Fprintln(os.Stderr, "seccompExec: bad errno or not amd64")
		os.Exit(125)
	}
	const (
		ldAbs        = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeq          = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		ret          = unix.BPF_RET | unix.BPF_K
		sysCachestat = 451 // x86_64
	)
	filter := []unix.SockFilter{
		{Code: ldAbs, K: 4}, // seccomp_data.arch
		{Code: jeq, Jt: 0, Jf: 3, K: unix.AUDIT_ARCH_X86_64},
		{Code: ldAbs, K: 0}, // seccomp_data.nr
		{Code: jeq, Jt: 0, Jf: 1, K: sysCachestat},
		{Code: ret, K: unix.SECCOMP_RET_ERRNO | uint32(errno)},
		{Code: ret, K: unix.SECCOMP_RET_ALLOW},
	}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	runtime.LockOSThread() // the filter is the thread's: exec from it
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "no_new_privs:", err)
		os.Exit(125)
	}
	if err := unix.Prctl(unix.PR_SET_SECCOMP, unix.SECCOMP_MODE_FILTER, uintptr(unsafe.Pointer(&prog)), 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "seccomp:", err)
		os.Exit(125)
	}
	err = syscall.Exec(os.Args[1], os.Args[1:], os.Environ())
	fmt.Fprintln(os.Stderr, "exec:", err)
	os.Exit(125)
}

// TestCachestatRefused: under a seccomp filter that refuses cachestat(2)
// (EPERM, as a runtime's profile may; ENOSYS, as an old kernel or a
// filter that hides the call), `flusherd run` refuses to start: exit 1
// before it watches anything, with a message naming the call, the cause
// and the fix, instead of tracking every file as dirty and failing each.
func TestCachestatRefused(t *testing.T) {
	testfs.SkipShort(t, "runs the daemon under a seccomp filter")
	if runtime.GOARCH != "amd64" {
		t.Skip("the filter is written for x86_64")
	}
	tree := t.TempDir()
	for _, tc := range []struct {
		errno unix.Errno
		want  string
	}{
		{unix.EPERM, "seccomp"},
		{unix.ENOSYS, "older than 6.5"},
	} {
		t.Run(unix.ErrnoName(tc.errno), func(t *testing.T) {
			self, err := os.Executable()
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, self, binary, "run", "--watch", tree, "--stats-dir", t.TempDir()+"/run")
			cmd.Env = append(os.Environ(), seccompEnv+"="+strconv.Itoa(int(tc.errno)), "JOURNAL_STREAM=", "NOTIFY_SOCKET=")
			out, err := cmd.CombinedOutput()
			code := -1
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			}
			if code != cli.ExitFailed || !strings.Contains(string(out), "cachestat(2)") || !strings.Contains(string(out), tc.want) {
				t.Errorf("exit %d (%v), want %d naming cachestat(2) and %q:\n%s", code, err, cli.ExitFailed, tc.want, out)
			}
			if strings.Contains(string(out), "watching") {
				t.Errorf("it set up its tree before refusing:\n%s", out)
			}
		})
	}
}
