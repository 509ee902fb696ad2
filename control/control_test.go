package control

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
)

func serve(t *testing.T) string { return serveIn(t, t.TempDir()) }

func serveIn(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "flusherd.sock")
	s, err := Listen(path, func(ctx context.Context, r Request) Response {
		var paths []string
		for _, p := range r.Paths {
			paths = append(paths, string(p))
		}
		return Response{OK: true, Files: []FileResult{{Path: Name(strings.Join(paths, ","))}}}
	}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(context.Background())
	t.Cleanup(func() { s.Close() })
	return path
}

func TestCall(t *testing.T) {
	path := serve(t)
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v, want 0600", st.Mode().Perm())
	}
	resp, err := Call(path, Request{Op: "sync", Paths: Names([]string{"/a", "/b"})}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	want := Response{OK: true, Files: []FileResult{{Path: "/a,/b"}}}
	if d := cmp.Diff(want, resp); d != "" {
		t.Errorf("(-want +got)\n%s", d)
	}
}

// raw sends bytes and returns the response line.
func raw(t *testing.T, path string, req []byte) string {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	go func() {
		c.Write(req)
		c.(*net.UnixConn).CloseWrite()
	}()
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	buf := make([]byte, 4096)
	n, _ := c.Read(buf)
	return string(buf[:n])
}

// TestStrictRequest: what encoding/json would let through is refused: a
// key in another case or with a character that folds to the same (U+017F
// for s), a key given twice (also in a name object), a name object
// without base64 or with another key; well-formed requests pass.
func TestStrictRequest(t *testing.T) {
	for line, want := range map[string]string{
		`{"op":"sync","paths":["op"]}`:                              "",
		`{"op":"sync","paths":[{"base64":"b3A="},"x"]}`:             "",
		`{"op":"sync","paths":null}`:                                "",
		`{"op":"dirty","top":3}`:                                    "",
		`{ "op" : "stats" }`:                                        "",
		`{"o\u0070":"stats"}`:                                       "",
		`{"op":"dirty","OP":"sync"}`:                                `unknown key "OP"`,
		`{"Op":"dirty"}`:                                            `unknown key "Op"`,
		`{"op":"sync","pathſ":["a"]}`:                               `unknown key "pathſ"`,
		`{"op":"sync","top":1,"op":"x"}`:                            `the key "op" is given twice`,
		`{"op":"sync","paths":[{"base64":"YQ==","base64":"Yg=="}]}`: `the key "base64" is given twice`,
		`{"op":"sync","paths":[{}]}`:                                `needs its key "base64"`,
		`{"op":"sync","paths":[{"base64":"YQ==","path":"x"}]}`:      `unknown key "path"`,
		`{"op":"sync","paths":[{"BASE64":"YQ=="}]}`:                 `unknown key "BASE64"`,
		"{\"op\":\"sync\",\"paths\":[\"/t/caf\xe9\"]}":              "not valid UTF-8",
		`{"op":"sync","paths":["/t/a\ud800b"]}`:                     "surrogate",
		`{"op":"sync","paths":["/t/a\udc00"]}`:                      "surrogate",
		`{"op":"sync","paths":["/t/\ud83d\ude00"]}`:                 "", // a pair: U+1F600
		`{"op":"sync","paths":["/t/\\ud800"]}`:                      "", // an escaped backslash, then text
		"{\"op\":\"sync\",\"paths\":[\"/t/caf\xef\xbf\xbd\"]}":      "", // U+FFFD itself
	} {
		err := strictRequest([]byte(line))
		switch {
		case want == "" && err != nil:
			t.Errorf("strictRequest(%s) = %v, want nil", line, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("strictRequest(%s) = %v, want an error with %q", line, err, want)
		}
	}
}

// TestBadRequests: malformed requests get an error response, and the
// server goes on.
func TestBadRequests(t *testing.T) {
	path := serve(t)
	tests := []struct {
		name, req, want string
	}{
		{"not json", "hello\n", "malformed request"},
		{"unknown field", `{"op":"sync","evil":1}` + "\n", "malformed request"},
		{"wrong type", `{"op":5}` + "\n", "malformed request"},
		{"empty", "", "reading request"},
		{"oversized", strings.Repeat("x", MaxRequest+10), "request too large"},
		{"two values", `{"op":"dirty"} {"op":"sync"}` + "\n", "something follows"},
		{"duplicate key", `{"op":"dirty","op":"sync"}` + "\n", `the key \"op\" is given twice`},
		{"key in another case", `{"op":"dirty","OP":"sync"}` + "\n", `unknown key \"OP\"`},
		{"a bracket after the object", `{"op":"dirty"}]` + "\n", "something follows"},
		{"a second line", `{"op":"dirty"}` + "\n" + `{"op":"sync"}` + "\n", "something follows"},
		{"paths on stats", `{"op":"stats","paths":["/etc/passwd"]}` + "\n", `\"paths\" is for \"sync\" and \"dirty\"`},
		{"top on sync", `{"op":"sync","top":3}` + "\n", `\"top\" is for \"dirty\"`},
		{"not UTF-8", "{\"op\":\"sync\",\"paths\":[\"/t/caf\xe9\"]}\n", "not valid UTF-8"},
		{"duplicate after a nested value", `{"paths":["a",{"base64":"Yg=="}],"op":"sync","paths":[]}` + "\n", `the key \"paths\" is given twice`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := raw(t, path, []byte(tc.req))
			if !strings.Contains(got, tc.want) || !strings.Contains(got, `"ok":false`) {
				t.Errorf("response %q, want an error containing %q", got, tc.want)
			}
		})
	}
	// The server survived all of them.
	if _, err := Call(path, Request{Op: "sync"}, 5*time.Second); err != nil {
		t.Fatalf("server down after bad requests: %v", err)
	}
}

func TestUnreachable(t *testing.T) {
	_, err := Call(filepath.Join(t.TempDir(), "none.sock"), Request{Op: "sync"}, time.Second)
	if err == nil || !strings.Contains(err.Error(), ErrUnreachable.Error()) {
		t.Fatalf("err = %v, want ErrUnreachable", err)
	}
}

// TestNonRootPeerRefused connects as nobody (the socket's mode is opened up
// for the test, so that SO_PEERCRED, not the file mode, refuses it).
func TestNonRootPeerRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a client as nobody")
	}
	if os.Getenv("FLUSHERD_CONTROL_CLIENT") != "" {
		t.Skip("client mode")
	}
	// A directory nobody can reach, for the socket and a copy of this
	// test binary.
	dir, err := os.MkdirTemp("", "flusherd-control")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "control.test")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	path := serveIn(t, dir)
	os.Chmod(path, 0o666)
	cmd := exec.Command(bin, "-test.run=TestClientHelper", "-test.v")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "FLUSHERD_CONTROL_CLIENT="+path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("client: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "permission denied: uid 65534") {
		t.Fatalf("non-root client was not refused:\n%s", out)
	}
}

// TestClientHelper is the client run by TestNonRootPeerRefused.
func TestClientHelper(t *testing.T) {
	path := os.Getenv("FLUSHERD_CONTROL_CLIENT")
	if path == "" {
		t.Skip("helper for TestNonRootPeerRefused")
	}
	resp, err := Call(path, Request{Op: "sync", Paths: Names([]string{"/x"})}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("response: ok=%v error=%s", resp.OK, resp.Error)
}

// TestNamesLossless: names that are not UTF-8 cross the socket byte for
// byte, and two that differ only in such bytes stay apart; UTF-8 names
// stay plain JSON strings.
func TestNamesLossless(t *testing.T) {
	names := []Name{"/w/caf\xe9.txt", "/w/caf\xe8.txt", "/w/café.txt", "/w/\xff\xfe", "/w/\ufffd\ufffd", "/w/new\nline"}
	path := filepath.Join(t.TempDir(), "flusherd.sock")
	s, err := Listen(path, func(ctx context.Context, r Request) Response {
		var files []FileResult
		for _, p := range r.Paths {
			files = append(files, FileResult{Path: p})
		}
		return Response{OK: true, Files: files, Dirty: []DirtyFile{{Path: r.Paths[0]}}}
	}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(context.Background())
	t.Cleanup(func() { s.Close() })
	resp, err := Call(path, Request{Op: "sync", Paths: names}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Files) != len(names) {
		t.Fatalf("%d files back, want %d", len(resp.Files), len(names))
	}
	for i, f := range resp.Files {
		if f.Path != names[i] {
			t.Errorf("name %q came back as %q", names[i], f.Path)
		}
	}
	if resp.Dirty[0].Path != names[0] {
		t.Errorf("dirty name %q came back as %q", names[0], resp.Dirty[0].Path)
	}
	b, err := json.Marshal(Name("/w/café.txt"))
	if err != nil || string(b) != `"/w/café.txt"` {
		t.Errorf("a UTF-8 name encodes as %s (%v), want a plain string", b, err)
	}
	b, _ = json.Marshal(Name("/w/caf\xe9.txt"))
	if string(b) != `{"base64":"L3cvY2Fm6S50eHQ="}` {
		t.Errorf("a non-UTF-8 name encodes as %s", b)
	}
}

// TestListenKeepsOtherFiles: a stale socket at the path is replaced; a
// regular file or a directory of that name is an error and stays.
func TestListenKeepsOtherFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "flusherd.sock")
	// A stale socket (a listener closed without unlinking).
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	s, err := Listen(path, func(context.Context, Request) Response { return Response{OK: true} }, zap.NewNop())
	if err != nil {
		t.Fatalf("over a stale socket: %v", err)
	}
	go s.Serve(context.Background())
	s.Close()
	for _, mk := range []func(string) error{
		func(p string) error { return os.WriteFile(p, []byte("a user's file"), 0o644) },
		func(p string) error { return os.Mkdir(p, 0o755) },
	} {
		os.Remove(path)
		if err := mk(path); err != nil {
			t.Fatal(err)
		}
		if _, err := Listen(path, nil, zap.NewNop()); err == nil || !strings.Contains(err.Error(), "is not a socket") {
			t.Errorf("Listen over a non-socket: %v, want \"is not a socket\"", err)
		}
		if _, err := os.Lstat(path); err != nil {
			t.Errorf("the file at the socket path was removed: %v", err)
		}
	}
}
