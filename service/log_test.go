package service

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"flusherd/internal/logpath"
)

// TestJournalLogging: under systemd (JOURNAL_STREAM set) a log line has no
// timestamp and starts with the journal's priority prefix; a file name with
// invalid UTF-8 and a newline stays on one line, escaped.
func TestJournalLogging(t *testing.T) {
	for _, tc := range []struct {
		journal bool
		want    []string
	}{
		{true, []string{"<6>INFO\tready", "<4>WARN\tslow", "<3>ERROR\tfailed"}},
		{false, []string{"INFO\tready", "WARN\tslow", "ERROR\tfailed"}},
	} {
		if tc.journal {
			t.Setenv("JOURNAL_STREAM", "8:1234")
		} else {
			t.Setenv("JOURNAL_STREAM", "")
		}
		var buf bytes.Buffer
		log := NewLogger(zapcore.InfoLevel, "console", &buf)
		log.Info("ready")
		log.Warn("slow")
		log.Error("failed")
		log.Debug("hidden")
		log.Info("file", logpath.String("path", "/t/bad-\xff\n.bin"))
		if !strings.Contains(buf.String(), `bad-\\xff\\n.bin`) {
			t.Errorf("file name not escaped losslessly:\n%s", buf.String())
		}
		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		if len(lines) != 4 {
			t.Fatalf("journal=%v: %d lines, want 4:\n%s", tc.journal, len(lines), buf.String())
		}
		for i, want := range tc.want {
			if tc.journal && !strings.HasPrefix(lines[i], want) {
				t.Errorf("journal line %q, want prefix %q", lines[i], want)
			}
			if !tc.journal && (!strings.Contains(lines[i], want) || strings.HasPrefix(lines[i], want)) {
				t.Errorf("terminal line %q: want a timestamp, then %q", lines[i], want)
			}
		}
	}
}

// TestLogLevels: at each level, the messages of that level and above are
// logged and those below are not.
func TestLogLevels(t *testing.T) {
	t.Setenv("JOURNAL_STREAM", "")
	for _, tc := range []struct {
		level string
		want  []string
	}{
		{"debug", []string{"DEBUG", "INFO", "WARN", "ERROR"}},
		{"info", []string{"INFO", "WARN", "ERROR"}},
		{"warn", []string{"WARN", "ERROR"}},
		{"error", []string{"ERROR"}},
	} {
		lvl, err := zap.ParseAtomicLevel(tc.level)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		log := NewLogger(lvl, "console", &buf)
		log.Debug("d")
		log.Info("i")
		log.Warn("w")
		log.Error("e")
		var got []string
		for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
			if f := strings.Split(l, "\t"); len(f) > 1 {
				got = append(got, f[1])
			}
		}
		if strings.Join(got, " ") != strings.Join(tc.want, " ") {
			t.Errorf("level %s: logged %q, want %q:\n%s", tc.level, got, tc.want, buf.String())
		}
	}
}

// TestLogFormats: "json" writes one JSON object a line (level, ts, msg,
// the fields), with the journal's prefix before it under systemd and no
// ts; "console" writes the timestamp, the level, the message and the
// fields as one JSON object, tab-separated. In both, a path field decodes
// to exactly the path: one with quotes and spaces, one not UTF-8.
func TestLogFormats(t *testing.T) {
	paths := []string{`/srv/a "quoted" dir/with spaces`, "/srv/caf\xe9/\xff\n.log"}
	for _, tc := range []struct {
		format  string
		journal bool
	}{{"json", false}, {"json", true}, {"console", false}, {"console", true}} {
		j := ""
		if tc.journal {
			j = "8:1234"
		}
		t.Setenv("JOURNAL_STREAM", j)
		var buf bytes.Buffer
		log := NewLogger(zapcore.DebugLevel, tc.format, &buf)
		for _, p := range paths {
			log.Warn("cannot track file", logpath.String("path", p), zap.Int("n", 7))
		}
		lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
		if len(lines) != len(paths) {
			t.Fatalf("%+v: %d lines, want %d:\n%s", tc, len(lines), len(paths), buf.String())
		}
		for i, l := range lines {
			if tc.journal != strings.HasPrefix(l, "<4>") {
				t.Errorf("%+v: line %q: journal prefix", tc, l)
			}
			l = strings.TrimPrefix(l, "<4>")
			var fields map[string]any
			if tc.format == "json" {
				if err := json.Unmarshal([]byte(l), &fields); err != nil {
					t.Fatalf("%+v: line %q is not JSON: %v", tc, l, err)
				}
				_, ts := fields["ts"]
				if fields["level"] != "warn" || fields["msg"] != "cannot track file" || fields["n"] != 7.0 || ts == tc.journal {
					t.Errorf("%+v: line %q: want level, msg, n and (outside the journal) ts", tc, l)
				}
			} else {
				f, n := strings.Split(l, "\t"), 4 // ts, level, msg, fields
				if tc.journal {
					n = 3
				}
				if len(f) != n || f[n-3] != "WARN" || f[n-2] != "cannot track file" {
					t.Fatalf("%+v: line %q: want [timestamp] WARN, the message and the fields, tab-separated", tc, l)
				}
				if err := json.Unmarshal([]byte(f[len(f)-1]), &fields); err != nil {
					t.Fatalf("%+v: fields %q are not JSON: %v", tc, f[len(f)-1], err)
				}
			}
			s, _ := fields["path"].(string)
			if got, err := logpath.Parse(s); err != nil || got != paths[i] {
				t.Errorf("%+v: path %q logged as %q, read back as %q, %v", tc, paths[i], s, got, err)
			}
		}
	}
}
