package earlysig

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

const helperEnv = "EARLYSIG_HELPER"

// TestMain, in a child started by TestCaughtFromInit (helperEnv set),
// reports what its package initialisation caught instead of running the
// tests: a SIGHUP it sends itself must arrive on Take's channel, not end
// it (SIGHUP's default action).
func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "" {
		os.Exit(m.Run())
	}
	c := Take()
	if c == nil {
		fmt.Print("no channel")
		os.Exit(0)
	}
	if Take() != nil {
		fmt.Print("a second channel")
		os.Exit(0)
	}
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	select {
	case s := <-c:
		fmt.Print("caught ", s)
	case <-time.After(10 * time.Second):
		fmt.Print("nothing caught")
	}
	os.Exit(0)
}

// TestCaughtFromInit: a process started as "run" holds SIGHUP, SIGTERM and
// SIGINT from its package initialisation on (a SIGHUP is caught, not
// fatal); one started as any other command does not (Take is nil).
func TestCaughtFromInit(t *testing.T) {
	for _, c := range []struct{ arg, want string }{
		{"run", "caught hangup"},
		{"sync", "no channel"},
	} {
		cmd := exec.Command(os.Args[0], c.arg)
		cmd.Env = append(os.Environ(), helperEnv+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("%s: %v (output %q)", c.arg, err, out)
			continue
		}
		if got := strings.TrimSpace(string(out)); got != c.want {
			t.Errorf("%s: %q, want %q", c.arg, got, c.want)
		}
	}
}
