package bdi

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite golden files")

func TestStatsGolden(t *testing.T) {
	s := Stats{
		BdiWriteback: 3, BdiReclaimable: 1000, BdiDirtyThresh: 1219097, DirtyThresh: 1219097,
		BackgroundThresh: 608804, BdiDirtied: 54715, BdiWritten: 53715, BdiWriteBandwidth: 102400,
		BDirty: 17, BIO: 2, BMoreIO: 1, BMoreIOWait: 4, BdiList: 1, State: WBRegistered | WBHasDirtyIO,
		PlugRequests: 3000, PlugMerges: 120, PlugBatches: 17, RetryPauseMs: 40, WritebackErrors: 2, InodesGone: 1, Rescans: 3, FailedFiles: 2, Throttled: 5, DetachedCalls: 7, ListLockMaxUs: 120, LoopStallMaxUs: 2500,
		SweepCandidates: 6, SweepFound: 2,
	}
	var buf bytes.Buffer
	if err := s.Format(&buf, 4096); err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "stats.golden")
	if *update {
		os.WriteFile(golden, buf.Bytes(), 0o644)
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(string(want), buf.String()); d != "" {
		t.Errorf("stats format (-golden +got)\n%s", d)
	}
}

// TestStatsKernelPrefix: the kernel's fields come first, in its order and
// padding; flusherd's own are b_more_io_wait (after b_more_io) and the
// lines after state.
func TestStatsKernelPrefix(t *testing.T) {
	kernel, err := os.ReadFile(filepath.Join("testdata", "kernel-stats"))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	(&Stats{}).Format(&buf, 4096)
	keys := func(b []byte) []string {
		var out []string
		for _, l := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
			out = append(out, string(l[:20])) // name and padding
		}
		return out
	}
	var ours []string
	for _, k := range keys(buf.Bytes()) {
		if k != "b_more_io_wait:     " {
			ours = append(ours, k)
		}
	}
	kk := keys(kernel)
	if d := cmp.Diff(kk, ours[:len(kk)]); d != "" {
		t.Errorf("kernel fields differ (-kernel +ours)\n%s", d)
	}
}

// TestParseStatsRoundTrip: what Format writes, ParseStats reads back to
// the same Stats (every field set to a distinct value, state included);
// unknown lines are skipped; malformed ones, and a file without the four
// lists, are errors.
func TestParseStatsRoundTrip(t *testing.T) {
	var s Stats
	for i, f := range s.statsFields() {
		v := int64(i*37 + 5)
		switch {
		case f.kB:
			*f.u = uint64(v) * 3 // pages
		case f.u != nil:
			*f.u = uint64(v)
		case f.i != nil:
			*f.i = v
		default:
			*f.n = int(v)
		}
	}
	s.State = 0x1f
	for _, page := range []int{4096, 65536} {
		var buf bytes.Buffer
		if err := s.Format(&buf, page); err != nil {
			t.Fatal(err)
		}
		got, err := ParseStats(append(buf.Bytes(), "a_newer_line:   3\n"...), page)
		if err != nil {
			t.Fatalf("page %d: %v", page, err)
		}
		if d := cmp.Diff(s, got); d != "" {
			t.Errorf("page %d: round trip (-wrote +read)\n%s", page, d)
		}
		if got.Tracked() != s.BDirty+s.BIO+s.BMoreIO+s.BMoreIOWait {
			t.Errorf("Tracked = %d", got.Tracked())
		}
	}
	lists := "b_dirty: 1\nb_io: 2\nb_more_io: 3\nb_more_io_wait: 4\n"
	if st, err := ParseStats([]byte(lists), 4096); err != nil || st.Tracked() != 10 {
		t.Errorf("the four lists alone: %d, %v", st.Tracked(), err)
	}
	for _, bad := range []struct{ data, line string }{
		{lists + "b_dirty: x\n", "line 5: "},
		{lists + "b_dirty 3\n", "line 5: "},
		{"b_dirty: 1\nb_io: 1 2 3\n" + lists, "line 2: "},
		{"b_io: 3\nb_dirty: 1\nb_more_io: 3\n", ""},
		{"", ""},
	} {
		_, err := ParseStats([]byte(bad.data), 4096)
		if !errors.Is(err, ErrStatsFormat) || !strings.HasPrefix(fmt.Sprint(err), bad.line) {
			t.Errorf("ParseStats(%q) = %v, want ErrStatsFormat naming %q", bad.data, err, bad.line)
		}
	}
}
