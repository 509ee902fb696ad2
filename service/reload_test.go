package service

import (
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"flusherd/config"
	"flusherd/tree"
)

// TestPlanTrees: a reload keeps what is unchanged and served, retires what
// is no longer configured, replaces what changed or is not served any
// more, and adds what is new; every list is in root order.
func TestPlanTrees(t *testing.T) {
	at := func(root string, expire time.Duration, mode tree.Mode) tree.Tree {
		return tree.Tree{Root: root, Recursive: true, Mode: mode, Expire: expire}
	}
	running := []tree.Tree{
		at("/z/same", time.Second, tree.ModeWriteback),
		at("/a/gone", time.Second, tree.ModeWriteback),
		at("/m/expire", time.Second, tree.ModeWriteback),
		at("/m/mode", time.Second, tree.ModeWriteback),
		at("/u/unserved", time.Second, tree.ModeWriteback),
	}
	configured := []tree.Tree{
		at("/z/same", time.Second, tree.ModeWriteback),
		at("/m/expire", 5*time.Second, tree.ModeWriteback),
		at("/m/mode", time.Second, tree.ModeIntegrity),
		at("/u/unserved", time.Second, tree.ModeWriteback),
		at("/b/new", time.Second, tree.ModeWriteback),
	}
	served := func(root string) bool { return root != "/u/unserved" }
	got := PlanTrees(running, configured, served)
	want := TreePlan{
		Keep:    []tree.Tree{at("/z/same", time.Second, tree.ModeWriteback)},
		Retire:  []tree.Tree{at("/a/gone", time.Second, tree.ModeWriteback)},
		Replace: []tree.Tree{at("/m/expire", time.Second, tree.ModeWriteback), at("/m/mode", time.Second, tree.ModeWriteback), at("/u/unserved", time.Second, tree.ModeWriteback)},
		Add:     []tree.Tree{at("/b/new", time.Second, tree.ModeWriteback), at("/m/expire", 5*time.Second, tree.ModeWriteback), at("/m/mode", time.Second, tree.ModeIntegrity), at("/u/unserved", time.Second, tree.ModeWriteback)},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("PlanTrees (-want +got)\n%s", d)
	}
	for root, replaced := range map[string]bool{"/m/expire": true, "/u/unserved": true, "/b/new": false, "/z/same": false, "/a/gone": false} {
		if got.Replaced(root) != replaced {
			t.Errorf("Replaced(%s) = %v, want %v", root, !replaced, replaced)
		}
	}
	// Returned: replaced with the same settings (it was not served).
	for root, returned := range map[string]bool{"/u/unserved": true, "/m/expire": false, "/m/mode": false, "/b/new": false, "/z/same": false} {
		if got.Returned(root) != returned {
			t.Errorf("Returned(%s) = %v, want %v", root, !returned, returned)
		}
	}
	// Nothing before: every tree is added; nothing after: every one retired.
	if p := PlanTrees(nil, configured, served); len(p.Add) != len(configured) || len(p.Keep)+len(p.Retire)+len(p.Replace) != 0 {
		t.Errorf("from nothing: %+v", p)
	}
	if p := PlanTrees(running, nil, served); len(p.Retire) != len(running) || len(p.Keep)+len(p.Add)+len(p.Replace) != 0 {
		t.Errorf("to nothing: %+v", p)
	}
}

// TestKeepStartOnly: the keys read at start only keep their running
// values in the reloaded configuration, with one warning each; the others
// take the new values.
func TestKeepStartOnly(t *testing.T) {
	old, cfg := config.Default(), config.Default()
	old.Stats.Dir, cfg.Stats.Dir = "/run/a", "/run/b"
	old.Metrics.Listen, cfg.Metrics.Listen = "", "127.0.0.1:9"
	cfg.Log.Format, cfg.Log.Level = "json", "debug"
	cfg.Watcher.RescanInterval = old.Watcher.RescanInterval + time.Second
	cfg.Writeback.MinPause = old.Writeback.MinPause + time.Second
	core, logs := observer.New(zap.InfoLevel)
	keepStartOnly(old, cfg, zap.New(core))
	if cfg.Stats.Dir != "/run/a" || cfg.Metrics.Listen != "" || cfg.Watcher.RescanInterval != old.Watcher.RescanInterval || cfg.Log.Format != "console" {
		t.Errorf("start-only keys not kept: %+v %+v %v %+v", cfg.Stats, cfg.Metrics, cfg.Watcher.RescanInterval, cfg.Log)
	}
	if cfg.Writeback.MinPause != old.Writeback.MinPause+time.Second || cfg.Log.Level != "debug" {
		t.Errorf("min_pause or log.level not reloaded: %v %q", cfg.Writeback.MinPause, cfg.Log.Level)
	}
	var keys []string
	for _, e := range logs.FilterMessage("this setting changes at the next start, not on reload").All() {
		keys = append(keys, e.ContextMap()["key"].(string))
	}
	if want := []string{"stats.dir", "watcher.rescan_interval", "metrics.listen", "log.format"}; !slices.Equal(keys, want) {
		t.Errorf("warned about %q, want %q", keys, want)
	}
}
