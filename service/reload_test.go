package service

import (
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"flusherd/bdi"
	"flusherd/config"
	"flusherd/watch"
)

// TestPlanTrees: a reload keeps what is unchanged and served, retires what
// is no longer configured, replaces what changed or is not served any
// more, and adds what is new; every list is in root order.
func TestPlanTrees(t *testing.T) {
	tree := func(root string, expire time.Duration, integrity bool) watch.Tree {
		return watch.Tree{Root: root, Recursive: true, Tree: bdi.Tree{Expire: expire, Integrity: integrity}}
	}
	running := []watch.Tree{
		tree("/z/same", time.Second, false),
		tree("/a/gone", time.Second, false),
		tree("/m/expire", time.Second, false),
		tree("/m/mode", time.Second, false),
		tree("/u/unserved", time.Second, false),
	}
	configured := []watch.Tree{
		tree("/z/same", time.Second, false),
		tree("/m/expire", 5*time.Second, false),
		tree("/m/mode", time.Second, true),
		tree("/u/unserved", time.Second, false),
		tree("/b/new", time.Second, false),
	}
	served := func(root string) bool { return root != "/u/unserved" }
	got := PlanTrees(running, configured, served)
	want := TreePlan{
		Keep:    []watch.Tree{tree("/z/same", time.Second, false)},
		Retire:  []watch.Tree{tree("/a/gone", time.Second, false)},
		Replace: []watch.Tree{tree("/m/expire", time.Second, false), tree("/m/mode", time.Second, false), tree("/u/unserved", time.Second, false)},
		Add:     []watch.Tree{tree("/b/new", time.Second, false), tree("/m/expire", 5*time.Second, false), tree("/m/mode", time.Second, true), tree("/u/unserved", time.Second, false)},
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
