package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPrintDefaultConfigRoundTrip: print-default-config, with its watch
// path pointed at an existing directory, is accepted by check-config, which
// prints the same configuration back.
func TestPrintDefaultConfigRoundTrip(t *testing.T) {
	var out, errb bytes.Buffer
	if code := Main([]string{"print-default-config"}, &out, &errb); code != exitOK {
		t.Fatalf("print-default-config: exit %d: %s", code, errb.String())
	}
	dir := t.TempDir()
	text := strings.Replace(out.String(), `"/srv/data"`, `"`+dir+`"`, 1)
	file := filepath.Join(t.TempDir(), "flusherd.toml")
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	var checked bytes.Buffer
	errb.Reset()
	if code := Main([]string{"check-config", file}, &checked, &errb); code != exitOK {
		t.Fatalf("check-config of the defaults: exit %d: %s", code, errb.String())
	}
	body := text[strings.Index(text, "[writeback]"):]
	if checked.String() != body {
		t.Errorf("check-config printed\n%s\nwant\n%s", checked.String(), body)
	}
}

func TestCheckConfigRejects(t *testing.T) {
	file := filepath.Join(t.TempDir(), "bad.toml")
	os.WriteFile(file, []byte("[writeback]\ndirty_expire_interval = 30\n"), 0o644)
	var out, errb bytes.Buffer
	code := Main([]string{"check-config", file}, &out, &errb)
	if code != exitUsage || !strings.Contains(errb.String(), "bad.toml:2: writeback.dirty_expire_interval") {
		t.Fatalf("exit %d, stderr %q: want exit 2 naming file, line and key", code, errb.String())
	}
	if out.Len() != 0 {
		t.Errorf("printed a configuration for a bad file: %s", out.String())
	}
}
