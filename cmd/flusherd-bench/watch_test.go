package main

import (
	"io"
	"strings"
	"testing"
)

func TestParseWatchStats(t *testing.T) {
	s, err := parseWatchStats([]byte("backend: fanotify\nevents:        1234\noverflows: 2\nrescans:   3\nunwatched_dirs: 0\nsomething_new: 7 kB\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s.Backend != "fanotify" {
		t.Errorf("backend %q", s.Backend)
	}
	for k, want := range map[string]uint64{"events": 1234, "overflows": 2, "rescans": 3, "unwatched_dirs": 0, "something_new": 7} {
		if got, ok := s.get(k); !ok || got != want {
			t.Errorf("%s = %d, %v; want %d", k, got, ok, want)
		}
	}
	if _, err := parseWatchStats([]byte("backend: inotify\n")); err == nil {
		t.Error("no events line: no error")
	}
	if _, err := parseWatchStats([]byte("events: x\n")); err == nil {
		t.Error("bad events value: no error")
	}
	s, err = parseWatchStats([]byte("events: 5\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.get("overflows"); ok {
		t.Error("absent overflows reported present")
	}
}

func TestTrackedIn(t *testing.T) {
	data := "BdiWriteback:                0 kB\nb_dirty:                   17\nb_io:                        2\nb_more_io:                   1\nb_more_io_wait:              4\nb_dirty_time:                0\nstate:                       5\n"
	if n, ok := trackedIn([]byte(data)); !ok || n != 24 {
		t.Errorf("trackedIn = %d, %v; want 24", n, ok)
	}
	if _, ok := trackedIn([]byte("b_dirty: 1\n")); ok {
		t.Error("incomplete file accepted")
	}
}

func TestThousandsAndTable(t *testing.T) {
	for n, want := range map[uint64]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567"} {
		if got := thousands(n); got != want {
			t.Errorf("thousands(%d) = %q", n, got)
		}
	}
	var tb wtable
	tb.set(3, "idle", "0", "inotify", "1.5 NOT met")
	tb.set(1, "ingest", "", "inotify", "10")
	tb.set(1, "ingest", "", "fanotify", "20")
	var b strings.Builder
	tb.print(&b, []string{"inotify", "fanotify"})
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[2], "| ingest") || !strings.Contains(lines[3], "-") {
		t.Errorf("table:\n%s", b.String())
	}
}

// TestParseFlags: --help is not an error (exit 0, the command does not
// run), a bad flag is (exit 2), and good flags let the command run.
func TestParseFlags(t *testing.T) {
	for _, c := range []struct {
		args    []string
		code    int
		proceed bool
	}{
		{[]string{"--help"}, 0, false},
		{[]string{"-h"}, 0, false},
		{[]string{"--bogus"}, 2, false},
		{[]string{"--n", "x"}, 2, false},
		{[]string{"--n", "3"}, 0, true},
	} {
		fl := newFlags("test", "a test.", "flusherd-bench test")
		fl.SetOutput(io.Discard)
		fl.Int("n", 1, "a number")
		code, ok := parseFlags(fl, c.args)
		if code != c.code || ok != c.proceed {
			t.Errorf("%v: code %d, run %v; want %d, %v", c.args, code, ok, c.code, c.proceed)
		}
	}
}

// TestLetters: a flag of one-letter choices refuses a letter it does not
// know, a repeated one and none at all, rather than running less than
// asked (plug --methods z ran syncfs only; blocked --phases z nothing).
func TestLetters(t *testing.T) {
	for _, c := range []struct {
		value string
		ok    bool
	}{
		{"abc", true}, {"c", true}, {"cab", true},
		{"z", false}, {"abz", false}, {"aa", false}, {"", false},
	} {
		if err := letters("phases", c.value, "abc"); (err == nil) != c.ok {
			t.Errorf("letters(%q) = %v, want ok %v", c.value, err, c.ok)
		}
	}
}
