package service

import (
	"context"
	"net"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"flusherd/config"
)

// TestMetricsListenHint: a metrics listen that fails under systemd
// ($INVOCATION_ID set) names the drop-in that gives the sandbox a network;
// outside systemd, a failure for another cause (the port taken) does not.
func TestMetricsListenHint(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	cfg := config.Default()
	cfg.Metrics.Listen = taken.Addr().String()
	for _, under := range []bool{false, true} {
		if under {
			t.Setenv("INVOCATION_ID", "0123456789abcdef")
		} else {
			t.Setenv("INVOCATION_ID", "")
		}
		core, logs := observer.New(zap.InfoLevel)
		StartMetrics(context.Background(), cfg, nil, nil, nil, zap.New(core))()
		es := logs.FilterMessageSnippet("cannot listen for metrics").All()
		if len(es) != 1 {
			t.Fatalf("under systemd %v: %d listen errors, want 1: %v", under, len(es), logs.All())
		}
		hint, _ := es[0].ContextMap()["hint"].(string)
		if got := strings.Contains(hint, "flusherd-metrics.conf"); got != under {
			t.Errorf("under systemd %v: hint %q", under, hint)
		}
	}
}
