package service

import (
	"bytes"
	"strings"
	"testing"

	"go.uber.org/zap/zapcore"

	"flusherd/watch"
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
		log := NewLogger(zapcore.InfoLevel, &buf)
		log.Info("ready")
		log.Warn("slow")
		log.Error("failed")
		log.Debug("hidden")
		log.Info("file", watch.Q("/t/bad-\xff\n.bin"))
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
