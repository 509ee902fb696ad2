// Package control is flusherd's control socket: a unix stream socket on
// which one request, a line of JSON, gets one response, a line of JSON,
// per connection.
//
// Requests and their responses:
//
//	{"op":"sync","paths":["/srv/db/wal"]}    integrity writeback of files, of
//	                                         the tracked files under a
//	                                         directory, or with no paths of
//	                                         every tracked file
//	{"ok":true,"files":[{"path":"/srv/db/wal"}]}
//	{"ok":false,"files":[{"path":"/x","error":"fdatasync: input/output error"}]}
//
//	{"op":"dirty","top":20}                  the tracked files, oldest first
//	{"op":"dirty","paths":["/srv/q"]}        those under the paths only
//	{"ok":true,"dirty":[{"path":"/srv/q/1","bdi":"7:0","list":"b_dirty",
//	  "dirty_pages":4,"writeback_pages":0,"age_seconds":3.2,"retries":0,
//	  "errors":0}]}
//
//	{"op":"status"}                          a line per tree, then the devices
//	{"ok":true,"status":{"trees":[{"root":"/srv/q","mode":"writeback",...}],
//	  "devices":[{"bdi":"7:0","tracked":1,...}]}}
//
//	{"op":"stats"}                           every device's stats, in the
//	                                         stats file's layout
//	{"ok":true,"devices":[{"bdi":"7:0","stats":"BdiWriteback: ..."}]}
//
// Paths are Names: a JSON string, or {"base64":"..."} for a name that is
// not UTF-8, so that every byte of a name survives.
//
// Any request can be answered {"ok":false,"error":"..."}: an unknown op, a
// malformed or oversized (over MaxRequest) request, a refused peer.
//
// The socket is created with mode 0600, and every peer is checked with
// SO_PEERCRED: only root and the daemon's own user are served (unix(7)).
package control

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"flusherd/policy"
)

// MaxRequest is the largest request accepted, in bytes.
const MaxRequest = 1 << 20

// Request is one command.
type Request struct {
	Op string `json:"op"` // "sync", "dirty", "stats" or "status"
	// Paths are what a "sync" writes back, and what a "dirty" lists
	// (the tracked files that are one of them or below one; absolute).
	Paths []Name `json:"paths,omitempty"`
	// Top limits a "dirty" answer to the oldest Top files; 0: all.
	Top int `json:"top,omitempty"`
}

// DirtyFile is one tracked file in a "dirty" answer.
type DirtyFile struct {
	Path Name   `json:"path"`
	Bdi  string `json:"bdi"`
	// List is b_dirty, b_io, b_more_io or b_more_io_wait.
	List string `json:"list"`
	// DirtyPages and WritebackPages are cachestat(2)'s counts at the time
	// of the request (or as last seen, when the file could not be opened
	// or read then).
	DirtyPages     uint64 `json:"dirty_pages"`
	WritebackPages uint64 `json:"writeback_pages"`
	// PagesUnknown: the counts could not be read now and none was seen
	// before (the 0s above mean unknown, not clean): the file is tracked
	// because a write to it was reported.
	PagesUnknown bool `json:"pages_unknown,omitempty"`
	// AgeSeconds is how long the file's data has been dirty.
	AgeSeconds float64 `json:"age_seconds"`
	// Retries counts the writeback attempts since the file was last
	// clean, the first one included; Errors, those that failed.
	Retries int `json:"retries"`
	Errors  int `json:"errors"`
	// LastError is the errno name of the last failed attempt ("EIO").
	LastError string `json:"last_error,omitempty"`
	// Busy: a writeback call for it exceeded attempt_timeout and has not
	// returned (a frozen or hung filesystem).
	Busy bool `json:"busy,omitempty"`
	// Probing: its device is probed with one file per pause, every retry
	// having failed with one device-level error (a dead FUSE server, a
	// vanished disk); the others wait for the probe to get through.
	Probing bool `json:"probing,omitempty"`
}

// DeviceStats is one device in a "stats" answer.
type DeviceStats struct {
	Bdi   string `json:"bdi"`
	Stats string `json:"stats"`
}

// FileResult is the outcome for one file; Error is empty on success.
type FileResult struct {
	Path  Name   `json:"path"`
	Error string `json:"error,omitempty"`
	// Gone: the file was deleted before its writeback (ESTALE, ENOENT,
	// or its path now names another file): it had nothing left to
	// write, which is no failure.
	Gone bool `json:"gone,omitempty"`
	// Refused: the path named is no file sync can write (not absolute,
	// not there, through a symbolic link, outside the trees, on a
	// filesystem without writeback, not a regular file or directory):
	// a bad argument, with Error saying why; nothing was attempted.
	Refused bool `json:"refused,omitempty"`
}

// Response is the answer to a Request. Empty fields are left out of its
// JSON: a "dirty" answer with no file tracked is {"ok":true}.
type Response struct {
	OK    bool         `json:"ok"`
	Error string       `json:"error,omitempty"`
	Files []FileResult `json:"files,omitempty"`
	Dirty []DirtyFile  `json:"dirty,omitempty"`
	// DirtyTotal is the number of tracked files a "dirty" answer was
	// chosen from (Dirty holds the oldest Top of them).
	DirtyTotal int `json:"dirty_total,omitempty"`
	// Outside holds the paths a "dirty" request named that are in no
	// served tree and hold none below them: no file there is tracked.
	Outside []Name        `json:"outside,omitempty"`
	Devices []DeviceStats `json:"devices,omitempty"`
	Status  *Status       `json:"status,omitempty"`
}

// Handler answers requests.
type Handler func(ctx context.Context, req Request) Response

// Server serves a control socket.
type Server struct {
	ln      *net.UnixListener
	path    string
	handler Handler
	log     *zap.Logger
	done    chan struct{}
}

// Listen creates the socket at path (removing a stale socket there) with
// mode 0600. Any other file at path is an error, left in place.
func Listen(path string, h Handler, log *zap.Logger) (*Server, error) {
	// Only a socket is removed (one a killed daemon left): any other
	// file of that name is not flusherd's to delete.
	if fi, err := os.Lstat(path); err == nil && fi.Mode().Type() != os.ModeSocket {
		return nil, fmt.Errorf("control: %s exists and is not a socket; not removing it", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("control: removing stale socket: %w", err)
	}
	old := unix.Umask(0o177)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	unix.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("control: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("control: %w", err)
	}
	return &Server{ln: ln, path: path, handler: h, log: log, done: make(chan struct{})}, nil
}

// MaxConns bounds the connections served at once; more wait in the
// listen backlog.
const MaxConns = 64

// Serve accepts connections until Close. An accept that fails for want of
// resources (EMFILE, ENFILE, ENOBUFS, ENOMEM) is retried after a pause
// that doubles up to a second, as net/http does, so running out of file
// descriptors for a while does not end the control socket.
func (s *Server) Serve(ctx context.Context) {
	defer close(s.done)
	slots := make(chan struct{}, MaxConns)
	var pause time.Duration
	for {
		slots <- struct{}{}
		c, err := s.ln.AcceptUnix()
		if err != nil {
			<-slots
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if policy.Shortage(err) && !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EINTR) {
				pause = min(max(2*pause, 5*time.Millisecond), time.Second)
				s.log.Warn("control socket: accept failed; retrying", zap.Error(err), zap.Stringer("pause", pause))
				time.Sleep(pause)
				continue
			}
			s.log.Error("control socket: accept failed; no more requests are served", zap.Error(err))
			return
		}
		pause = 0
		go func() {
			defer func() { <-slots }()
			s.serve(ctx, c)
		}()
	}
}

// strictRequest checks the request line (already decoded without error)
// for what encoding/json lets through: bytes that are not UTF-8 and lone
// UTF-16 surrogate escapes (both read as U+FFFD: the request would name
// another file; a name that is not UTF-8 goes as {"base64": ...}), keys
// matched without regard to case ("OP", or "pathſ" for "paths", each
// standing for a field), keys given twice (the last value kept), at the
// top level and in a name object, and a name object without its one key,
// base64. A request that could be read two ways is refused rather than
// half obeyed.
func strictRequest(line []byte) error {
	if !utf8.Valid(line) || loneSurrogate(line) {
		return errors.New(`not valid UTF-8, or a \u escape of half a UTF-16 surrogate pair (JSON strings are read as UTF-8; a name that is not goes as {"base64": "..."})`)
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return errors.New("not a JSON object")
	}
	_, err := objectKeys(dec, map[string]func(*json.Decoder) error{
		"op": skipValue, "top": skipValue,
		"paths": func(dec *json.Decoder) error {
			tok, err := dec.Token()
			if err != nil || tok == nil {
				return err
			}
			if tok != json.Delim('[') {
				return errors.New(`"paths" is not an array`)
			}
			for dec.More() {
				tok, err := dec.Token()
				if err != nil {
					return err
				}
				if tok == json.Delim('{') {
					seen, err := objectKeys(dec, map[string]func(*json.Decoder) error{"base64": skipValue})
					if err != nil {
						return err
					}
					if !seen["base64"] {
						return errors.New(`a name object needs its key "base64"`)
					}
				}
			}
			_, err = dec.Token() // ']'
			return err
		},
	})
	return err
}

// loneSurrogate reports whether a JSON text holds, in a string, a \u
// escape of a UTF-16 surrogate that is not half of a pair (\ud800 alone):
// encoding/json reads it as U+FFFD.
func loneSurrogate(b []byte) bool {
	hex4 := func(i int) (rune, bool) {
		if i+4 > len(b) {
			return 0, false
		}
		v, err := strconv.ParseUint(string(b[i:i+4]), 16, 32)
		return rune(v), err == nil
	}
	in := false
	for i := 0; i < len(b); i++ {
		switch {
		case !in:
			in = b[i] == '"'
		case b[i] == '"':
			in = false
		case b[i] == '\\' && i+1 < len(b) && b[i+1] == 'u':
			r, ok := hex4(i + 2)
			switch {
			case !ok:
			case r >= 0xd800 && r < 0xdc00:
				if i+7 < len(b) && b[i+6] == '\\' && b[i+7] == 'u' {
					if r2, ok := hex4(i + 8); ok && r2 >= 0xdc00 && r2 < 0xe000 {
						i += 11
						continue
					}
				}
				return true
			case r >= 0xdc00 && r < 0xe000:
				return true
			}
			i += 5
		case b[i] == '\\':
			i++ // the escaped character
		}
	}
	return false
}

// fieldsOfOp refuses a field the request's op does not use ("paths" is
// sync's and dirty's, "top" dirty's): it would be ignored, and the request
// would do other than it says.
func fieldsOfOp(req Request) error {
	if req.Paths != nil && req.Op != "sync" && req.Op != "dirty" {
		return fmt.Errorf(`"paths" is for "sync" and "dirty", not %q`, req.Op)
	}
	if req.Top != 0 && req.Op != "dirty" {
		return fmt.Errorf(`"top" is for "dirty", not %q`, req.Op)
	}
	return nil
}

// objectKeys reads the rest of an object whose '{' was read: each key must
// be one of fields, exactly, and given once; its value is read by the
// field's function. It returns the keys seen.
func objectKeys(dec *json.Decoder, fields map[string]func(*json.Decoder) error) (map[string]bool, error) {
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, _ := tok.(string)
		f, ok := fields[key]
		if !ok {
			names := make([]string, 0, len(fields))
			for k := range fields {
				names = append(names, strconv.Quote(k))
			}
			slices.Sort(names)
			return nil, fmt.Errorf("unknown key %q (keys are matched exactly: %s)", key, strings.Join(names, ", "))
		}
		if seen[key] {
			return nil, fmt.Errorf("the key %q is given twice", key)
		}
		seen[key] = true
		if err := f(dec); err != nil {
			return nil, err
		}
	}
	_, err := dec.Token() // '}'
	return seen, err
}

// skipValue reads one JSON value, whatever it is.
func skipValue(dec *json.Decoder) error {
	depth := 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			depth++
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
		if depth == 0 {
			return nil
		}
	}
}

// Close stops accepting and removes the socket.
func (s *Server) Close() error {
	err := s.ln.Close()
	<-s.done
	return err
}

func (s *Server) serve(ctx context.Context, c *net.UnixConn) {
	defer c.Close()
	reply := func(r Response) {
		c.SetWriteDeadline(time.Now().Add(10 * time.Second))
		json.NewEncoder(c).Encode(r)
	}
	if err := checkPeer(c); err != nil {
		s.log.Warn("control socket: peer refused", zap.Error(err))
		reply(Response{Error: err.Error()})
		return
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	rd := bufio.NewReader(io.LimitReader(c, MaxRequest+1))
	line, err := rd.ReadBytes('\n')
	switch {
	case len(line) > MaxRequest:
		reply(Response{Error: fmt.Sprintf("request too large (over %d bytes)", MaxRequest)})
		return
	case err != nil && !(errors.Is(err, io.EOF) && len(line) > 0):
		reply(Response{Error: "reading request: " + err.Error()})
		return
	}
	var req Request
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		reply(Response{Error: "malformed request: " + err.Error()})
		return
	}
	if rest := bytes.TrimSpace(line[dec.InputOffset():]); len(rest) > 0 || rd.Buffered() > 0 {
		reply(Response{Error: "malformed request: something follows the JSON object (one request, one line, per connection)"})
		return
	}
	if err := strictRequest(line); err != nil {
		reply(Response{Error: "malformed request: " + err.Error()})
		return
	}
	if err := fieldsOfOp(req); err != nil {
		reply(Response{Error: "malformed request: " + err.Error()})
		return
	}
	c.SetReadDeadline(time.Time{})
	reply(s.handler(ctx, req))
}

// deniedSocket says whose the control socket at path is, for a connection
// refused with EACCES or EPERM: its owner (and root) may use it (mode 0600,
// in a directory of the daemon's user).
func deniedSocket(path string) string {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil || st.Uid == 0 {
		return fmt.Sprintf("the control socket %s is root-only", path)
	}
	return fmt.Sprintf("the control socket %s is only for its owner, uid %d, and root", path, st.Uid)
}

// ErrUnreachable wraps the error of a Call that found no daemon.
var ErrUnreachable = errors.New("flusherd is not reachable")

// ErrNotSent wraps the error of a Call whose request could not be written
// (for example because the timeout ran out first): the daemon did nothing.
var ErrNotSent = errors.New("the request was not sent")

// Call sends req to the daemon at the socket path and returns its
// response. A missing socket or a refused connection wraps ErrUnreachable.
func Call(path string, req Request, timeout time.Duration) (Response, error) {
	c, err := net.DialTimeout("unix", path, 5*time.Second)
	if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
		return Response{}, fmt.Errorf("%s: %w", deniedSocket(path), err)
	}
	if err != nil {
		return Response{}, fmt.Errorf("%w: %w", ErrUnreachable, err)
	}
	defer c.Close()
	if timeout > 0 {
		c.SetDeadline(time.Now().Add(timeout))
	}
	// The daemon may answer (a refusal) before reading the request, so a
	// failed write is reported only if no answer can be read either.
	werr := json.NewEncoder(c).Encode(req)
	var resp Response
	if err := json.NewDecoder(bufio.NewReader(io.LimitReader(c, 64<<20))).Decode(&resp); err != nil {
		if werr != nil {
			return Response{}, fmt.Errorf("%w: %w", ErrNotSent, werr)
		}
		return Response{}, fmt.Errorf("reading the response: %w", err)
	}
	return resp, nil
}

// checkPeer allows root and the daemon's own user.
func checkPeer(c *net.UnixConn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) })
	if cerr != nil {
		return fmt.Errorf("SO_PEERCRED: %w", cerr)
	}
	if cred.Uid != 0 && int(cred.Uid) != os.Geteuid() {
		return fmt.Errorf("permission denied: uid %d may not use the flusherd control socket (root only)", cred.Uid)
	}
	return nil
}

// SocketPath is where the daemon whose stats directory is statsDir
// listens.
func SocketPath(statsDir string) string { return filepath.Join(statsDir, "flusherd.sock") }
