package logpath

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

var names = []struct {
	name  string
	plain bool // logged as it is
}{
	{`/srv/a "quoted" name with spaces`, true},
	{"/t/café/\ufffd", true}, // U+FFFD itself is valid UTF-8
	{"/t/new\nline\ttab", true},
	{"/t/bad-\xff\n.bin", false},
	{"/t/caf\xe9", false},
	{`"/leading-quote"`, false},
	{"", true},
}

// jsonLogger logs JSON lines without a timestamp to buf.
func jsonLogger(buf *bytes.Buffer) *zap.Logger {
	ec := zap.NewProductionEncoderConfig()
	ec.TimeKey = ""
	return zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(ec), zapcore.AddSync(buf), zapcore.InfoLevel))
}

// TestRoundTrip: a name logged through zap's JSON encoder and decoded with
// encoding/json and Parse is exactly the name; a valid UTF-8 name is
// logged as it is.
func TestRoundTrip(t *testing.T) {
	for _, tc := range names {
		var buf bytes.Buffer
		jsonLogger(&buf).Info("m", String("path", tc.name), Strings("first", []string{tc.name, "/x"}))
		var line struct {
			Path  string   `json:"path"`
			First []string `json:"first"`
		}
		if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
			t.Fatalf("%q: %v in %s", tc.name, err, buf.String())
		}
		if (line.Path == tc.name) != tc.plain {
			t.Errorf("%q logged as %q: want plain %v", tc.name, line.Path, tc.plain)
		}
		for _, s := range []string{line.Path, line.First[0]} {
			got, err := Parse(s)
			if err != nil || got != tc.name {
				t.Errorf("%q logged as %q, parsed back as %q, %v", tc.name, s, got, err)
			}
		}
		if len(line.First) != 2 || line.First[1] != "/x" {
			t.Errorf("first = %q", line.First)
		}
	}
}

// TestNotUTF8Lossy: what the helper is for. zap alone writes an invalid
// byte as U+FFFD, so two names that differ in it log alike; through
// String they do not.
func TestNotUTF8Lossy(t *testing.T) {
	logged := func(f func(string) zap.Field, p string) string {
		var buf bytes.Buffer
		jsonLogger(&buf).Info("m", f(p))
		return buf.String()
	}
	raw := func(p string) zap.Field { return zap.String("path", p) }
	ours := func(p string) zap.Field { return String("path", p) }
	a, b := "/t/\xff", "/t/\xfe"
	if logged(raw, a) != logged(raw, b) {
		t.Fatalf("zap now keeps invalid UTF-8 apart: %s %s", logged(raw, a), logged(raw, b))
	}
	if la, lb := logged(ours, a), logged(ours, b); la == lb || !strings.Contains(la, `\\xff`) {
		t.Errorf("String logs %q and %q as %s and %s", a, b, la, lb)
	}
}

// TestParseBad: a quoted form that does not unquote is an error.
func TestParseBad(t *testing.T) {
	if _, err := Parse(`"/t/\q"`); err == nil {
		t.Error("Parse of a bad quoted form: no error")
	}
}
