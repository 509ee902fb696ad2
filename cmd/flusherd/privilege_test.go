package main

import (
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"flusherd/internal/cli"
)

// nobodyCred returns the credentials of the user nobody, for a daemon run
// without privileges; the test is skipped when not root, and fails when
// there is no such user (CI).
func nobodyCred(t *testing.T) *syscall.Credential {
	t.Helper()
	if euid := os.Geteuid(); euid != 0 {
		t.Skipf("needs root to run flusherd as another user (euid=%d)", euid)
	}
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Fatalf("no user nobody: %v", err)
	}
	uid, err1 := strconv.ParseUint(nobody.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(nobody.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		t.Fatalf("user nobody: uid %q gid %q", nobody.Uid, nobody.Gid)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}
}

// TestWithoutPrivileges: what the daemon cannot do as an ordinary user is
// refused with a message that names the cause, not the filesystem: a tree
// root it may not read (exit 2, the configuration asks for what cannot be,
// with the auto and the inotify backend), fanotify asked for by name
// (exit 2: it needs CAP_SYS_ADMIN and CAP_DAC_READ_SEARCH), and the control
// socket of a daemon of another user (exit 1, naming the socket's owner).
func TestWithoutPrivileges(t *testing.T) {
	t.Parallel()
	cred := nobodyCred(t)
	base := t.TempDir()
	if err := makeSearchable(base); err != nil {
		t.Fatal(err)
	}
	closed := filepath.Join(base, "closed") // root's, mode 0700
	open := filepath.Join(base, "open")
	if err := os.Mkdir(closed, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(open, 0o755); err != nil {
		t.Fatal(err)
	}
	// A start refused: its exit status and output.
	refused := func(t *testing.T, conf string) (int, string) {
		t.Helper()
		d := runDaemon(t, conf, daemonOpts{cred: cred, mayExit: true})
		if !d.exited() {
			t.Fatalf("flusherd started:\n%s", d.log.String())
		}
		return d.exitCode(), d.log.String()
	}
	for _, backend := range []string{"auto", "inotify"} {
		t.Run("unreadable-root-"+backend, func(t *testing.T) {
			code, out := refused(t, fmt.Sprintf("[watcher]\nbackend = %q\n[[watch]]\npath = %q\n", backend, closed))
			if code != cli.ExitUsage || !strings.Contains(out, "may not read the tree") {
				t.Errorf("exit %d, want %d and \"may not read the tree\":\n%s", code, cli.ExitUsage, out)
			}
			if strings.Contains(out, "refuses fanotify") {
				t.Errorf("the filesystem blamed for a permission:\n%s", out)
			}
		})
	}
	t.Run("fanotify-by-name", func(t *testing.T) {
		code, out := refused(t, fmt.Sprintf("[watcher]\nbackend = \"fanotify\"\n[[watch]]\npath = %q\n", open))
		if code != cli.ExitUsage || !strings.Contains(out, "fanotify is not permitted") || !strings.Contains(out, "CAP_SYS_ADMIN") {
			t.Errorf("exit %d, want %d and \"fanotify is not permitted ... CAP_SYS_ADMIN\":\n%s", code, cli.ExitUsage, out)
		}
	})
	t.Run("socket-of-another-user", func(t *testing.T) {
		if err := makeSearchable(open); err != nil {
			t.Fatal(err)
		}
		d := runDaemon(t, fmt.Sprintf("[watcher]\nbackend = \"inotify\"\n[[watch]]\npath = %q\n", open), daemonOpts{cred: cred})
		other := &syscall.Credential{Uid: cred.Uid - 1, Gid: cred.Gid, Groups: []uint32{}}
		code, out := runAs(t, other, "dirty", "--stats-dir", d.statsDir)
		want := fmt.Sprintf("only for its owner, uid %d, and root", cred.Uid)
		if code != cli.ExitFailed || !strings.Contains(out, want) {
			t.Errorf("dirty as uid %d: exit %d, want %d and %q:\n%s", other.Uid, code, cli.ExitFailed, want, out)
		}
		d.stop(t)
	})
}
