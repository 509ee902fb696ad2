package service

import (
	"bufio"
	"errors"
	"flusherd/internal/testfs"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// claimPeerEnv, set to a claim directory, makes the test binary a peer:
// another process with claims of its own (record locks belong to the
// process), driven by lines on standard input (claimPeer).
const claimPeerEnv = "FLUSHERD_CLAIM_PEER"

func TestMain(m *testing.M) {
	if dir := os.Getenv(claimPeerEnv); dir != "" {
		claimPeer(dir)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// claimPeer answers "claim PATH rec|flat" and "release PATH", one line
// each: "ok", or "refused OTHER PID" (OTHER "-" for a tree inside), or
// "error TEXT". It ends at the end of its input.
func claimPeer(dir string) {
	c, err := OpenTreeClaims(dir)
	if err != nil {
		fmt.Println("error", err)
		return
	}
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 3 && f[0] == "claim":
			fmt.Println(claimReply(c.Claim(f[1], f[2] == "rec")))
		case len(f) == 2 && f[0] == "release":
			c.Release(f[1])
			fmt.Println("ok")
		default:
			fmt.Println("error bad command", sc.Text())
		}
	}
	c.Close()
}

// claimReply is claimPeer's line for Claim's err.
func claimReply(err error) string {
	var ce *ClaimError
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &ce) && errors.Is(err, ErrTreeClaimed):
		other := ce.Other
		if other == "" {
			other = "-"
		}
		return fmt.Sprintf("refused %s %d", other, ce.Pid)
	}
	return "error " + err.Error()
}

// peer is a claimPeer process.
type peer struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

func startPeer(t *testing.T, dir string) *peer {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), claimPeerEnv+"="+dir)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &peer{cmd: cmd, in: in, out: bufio.NewReader(out)}
	t.Cleanup(func() { p.in.Close(); p.cmd.Wait() })
	return p
}

// do sends one command and returns the answer.
func (p *peer) do(t *testing.T, cmd string) string {
	t.Helper()
	if _, err := fmt.Fprintln(p.in, cmd); err != nil {
		t.Fatal(err)
	}
	line, err := p.out.ReadString('\n')
	if err != nil {
		t.Fatalf("peer, after %q: %v", cmd, err)
	}
	return strings.TrimSpace(line)
}

// claimTree makes the directories of a tree for the claims: a, a/b and
// a/b/c and a/x.
func claimTree(t *testing.T) (claims, a string) {
	t.Helper()
	base := t.TempDir()
	a = filepath.Join(base, "a")
	for _, d := range []string{"a/b/c", "a/x"} {
		if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(base, "run", "trees"), a
}

// TestTreeClaims: with another process holding claims, a claim on the
// same root is refused naming its pid; so is one inside its recursive
// root, and a recursive one around its root; one inside its
// non-recursive root, or beside it, is not. Released, or the process
// gone, the claim is taken; the claim files go with the last claim.
func TestTreeClaims(t *testing.T) {
	dir, a := claimTree(t)
	b, c, x := filepath.Join(a, "b"), filepath.Join(a, "b", "c"), filepath.Join(a, "x")
	mine, err := OpenTreeClaims(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer mine.Close()
	p := startPeer(t, dir)
	pid := p.cmd.Process.Pid
	for _, tc := range []struct {
		peer      string // the peer's claim, released after the case
		root      string // then ours
		recursive bool
		other     string // refused by the peer's root ("-": one inside ours); "": taken
	}{
		{"claim " + b + " flat", b, false, b},
		{"claim " + b + " flat", b, true, b},
		{"claim " + a + " rec", c, false, a},
		{"claim " + a + " rec", a, false, a},
		{"claim " + a + " flat", c, true, ""},
		{"claim " + c + " flat", a, true, "-"},
		{"claim " + c + " flat", a, false, ""},
		{"claim " + c + " rec", x, true, ""},
	} {
		if got := p.do(t, tc.peer); got != "ok" {
			t.Fatalf("peer %s: %s", tc.peer, got)
		}
		err := mine.Claim(tc.root, tc.recursive)
		if got, want := claimReply(err), fmt.Sprintf("refused %s %d", tc.other, pid); tc.other != "" && got != want {
			t.Errorf("peer %s; claim %s (recursive %v): %s, want %s", tc.peer, tc.root, tc.recursive, got, want)
		} else if tc.other == "" && err != nil {
			t.Errorf("peer %s; claim %s (recursive %v): %v, want it taken", tc.peer, tc.root, tc.recursive, err)
		}
		mine.Release(tc.root)
		p.do(t, "release "+strings.Fields(tc.peer)[1])
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("claim files left after every claim was released: %v", ents)
	}

	// Ours, refused to the peer; given up, or changed, the peer's turn.
	if err := mine.Claim(a, true); err != nil {
		t.Fatal(err)
	}
	if got, want := p.do(t, "claim "+c+" flat"), fmt.Sprintf("refused %s %d", a, os.Getpid()); got != want {
		t.Errorf("peer claim inside our recursive root: %s, want %s", got, want)
	}
	if err := mine.Claim(a, false); err != nil {
		t.Fatal(err)
	}
	if got := p.do(t, "claim "+c+" flat"); got != "ok" {
		t.Errorf("peer claim inside our root made non-recursive: %s", got)
	}
	if err := mine.Claim(a, true); err == nil || !errors.Is(err, ErrTreeClaimed) {
		t.Errorf("our root made recursive around the peer's: %v, want refused", err)
	}
	if got, want := p.do(t, "claim "+x+" rec"), "ok"; got != want {
		t.Errorf("peer claim beside: %s (our failed change must leave a non-recursive)", got)
	}

	// The peer killed: its claims go with it.
	p.cmd.Process.Kill()
	p.cmd.Wait()
	if err := mine.Claim(a, true); err != nil {
		t.Errorf("after the peer was killed: %v", err)
	}
	if err := mine.Claim(c, false); err != nil {
		t.Errorf("after the peer was killed: %v", err)
	}
}

// TestTreeClaimsNested: one daemon's own trees may nest; its nested
// root released, its recursive root is still refused to another.
func TestTreeClaimsNested(t *testing.T) {
	dir, a := claimTree(t)
	c := filepath.Join(a, "b", "c")
	mine, err := OpenTreeClaims(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer mine.Close()
	for _, r := range []string{c, a} {
		if err := mine.Claim(r, true); err != nil {
			t.Fatalf("claim %s: %v", r, err)
		}
	}
	mine.Release(c)
	p := startPeer(t, dir)
	want := fmt.Sprintf("refused %s %d", a, os.Getpid())
	for _, cmd := range []string{"claim " + c + " flat", "claim " + a + " flat"} {
		if got := p.do(t, cmd); got != want {
			t.Errorf("peer %s: %s, want %s", cmd, got, want)
		}
	}
}

// TestClaimErrorText: the refusals say who holds what, and what to do.
func TestClaimErrorText(t *testing.T) {
	for _, tc := range []struct {
		e    ClaimError
		want string
	}{
		{ClaimError{Root: "/srv/logs", Other: "/srv/logs", Pid: 1234}, `"/srv/logs" is served by another flusherd (pid 1234); stop it first`},
		{ClaimError{Root: "/srv/logs", Other: "/srv", Pid: 7}, `"/srv/logs" is inside "/srv", which another flusherd (pid 7) serves with its subdirectories; stop it first`},
		{ClaimError{Root: "/srv", Pid: 7}, `a tree inside "/srv" is served by another flusherd (pid 7); stop it first`},
		{ClaimError{Root: "/srv", Other: "/srv"}, `"/srv" is served by another flusherd (in another pid namespace); stop it first`},
	} {
		if got := tc.e.Error(); got != tc.want {
			t.Errorf("%+v: %s\nwant %s", tc.e, got, tc.want)
		}
	}
}

// TestTreeClaimsDir: a claim directory others may write in is refused; a
// nil TreeClaims claims nothing.
func TestTreeClaimsDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "trees")
	if err := os.Mkdir(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o777)
	if _, err := OpenTreeClaims(dir); err == nil {
		t.Error("a world-writable claim directory was accepted")
	}
	var none *TreeClaims
	if err := none.Claim("/", true); err != nil {
		t.Errorf("nil TreeClaims: %v", err)
	}
	none.Release("/")
	none.Close()
}

// TestTreeClaimsReusedInode: a directory made with the inode number of
// one that another daemon claimed and that was removed since is not
// that one: it is taken (ext4 hands a freed number to the next inode).
func TestTreeClaimsReusedInode(t *testing.T) {
	mnt := testfs.Mount(t, testfs.Options{Type: "ext4"})
	dir := filepath.Join(t.TempDir(), "trees")
	a, b := filepath.Join(mnt.Dir, "a"), filepath.Join(mnt.Dir, "b")
	if err := os.Mkdir(a, 0o755); err != nil {
		t.Fatal(err)
	}
	var before, after unix.Stat_t
	if err := unix.Stat(a, &before); err != nil {
		t.Fatal(err)
	}
	p := startPeer(t, dir)
	if got := p.do(t, "claim "+a+" rec"); got != "ok" {
		t.Fatalf("peer claim %s: %s", a, got)
	}
	if err := os.Remove(a); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(b, &after); err != nil || after.Ino != before.Ino {
		t.Fatalf("%s has inode %d, not the removed %s's %d (%v): the reuse this test is about did not happen", b, after.Ino, a, before.Ino, err)
	}
	mine, err := OpenTreeClaims(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer mine.Close()
	if err := mine.Claim(b, true); err != nil {
		t.Errorf("claim of a new directory with a removed claimed one's inode number: %v", err)
	}
}

// TestStaleClaimsSwept: the claim files of a daemon that was killed (its
// locks gone with it, its files left) are removed when a daemon opens the
// claim directory; those a live daemon holds are kept, and still refuse
// its roots.
func TestStaleClaimsSwept(t *testing.T) {
	dir, a := claimTree(t)
	b, x := filepath.Join(a, "b"), filepath.Join(a, "x")
	killed := startPeer(t, dir)
	if got := killed.do(t, "claim "+x+" flat"); got != "ok" {
		t.Fatalf("peer claim %s: %s", x, got)
	}
	// The live peer claims b: it shares the files of the directories
	// above both roots, not x's own.
	live := startPeer(t, dir)
	if got := live.do(t, "claim "+b+" flat"); got != "ok" {
		t.Fatalf("peer claim %s: %s", b, got)
	}
	killed.cmd.Process.Kill()
	killed.cmd.Wait()
	xKeys, _, err := dirKeys(x)
	if err != nil {
		t.Fatal(err)
	}
	names := func() map[string]bool {
		ents, _ := os.ReadDir(dir)
		m := map[string]bool{}
		for _, e := range ents {
			m[e.Name()] = true
		}
		return m
	}
	want := names()
	if !want[xKeys[0].name()] {
		t.Fatalf("precondition: the killed peer's claim file of %s is not there: %v", x, want)
	}
	delete(want, xKeys[0].name())
	mine, err := OpenTreeClaims(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer mine.Close()
	if got := names(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("claim files after the sweep: %v, want %v", got, want)
	}
	if err := mine.Claim(b, false); !errors.Is(err, ErrTreeClaimed) {
		t.Errorf("claim of the live peer's root after the sweep: %v, want refused", err)
	}
	if err := mine.Claim(x, false); err != nil {
		t.Errorf("claim of the killed peer's root: %v", err)
	}
}
