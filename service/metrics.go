package service

import (
	"context"
	"errors"
	"net"
	"os"

	"go.uber.org/zap"
	"golang.org/x/net/netutil"
	"golang.org/x/sys/unix"

	"flusherd/bdi"
	"flusherd/config"
	"flusherd/metrics"
	"flusherd/watch"
)

// metricsDropInHint is what a metrics endpoint needs under the shipped
// unit, whose sandbox has no network (PrivateNetwork=yes,
// RestrictAddressFamilies=AF_UNIX: socket(2) fails with EAFNOSUPPORT).
const metricsDropInHint = "the shipped flusherd.service allows no network; install its drop-in " +
	"(/usr/share/doc/flusherd/flusherd-metrics.conf, or systemd/flusherd-metrics.conf in the source) as " +
	"/etc/systemd/system/flusherd.service.d/metrics.conf, then systemctl daemon-reload and restart flusherd"

// StartMetrics serves the Prometheus metrics of reg and wat on
// metrics.listen until ctx ends, with /healthz (Liveness of reg's devices
// within HealthLimit) and /readyz (ready); with metrics.listen empty it
// does nothing. A failure to listen is logged as an error and flusherd runs on
// without metrics. The returned function waits until the server has
// stopped.
func StartMetrics(ctx context.Context, cfg *config.Config, reg *bdi.Registry, wat watch.Backend, ready func() error, log *zap.Logger) (wait func()) {
	addr := cfg.Metrics.Listen
	if addr == "" {
		return func() {}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fields := []zap.Field{zap.String("listen", addr), zap.Error(err)}
		if errors.Is(err, unix.EAFNOSUPPORT) || UnderSystemd() {
			fields = append(fields, zap.String("hint", metricsDropInHint))
		}
		log.Error("cannot listen for metrics; running without them", fields...)
		return func() {}
	}
	log.Info("serving metrics", zap.String("url", "http://"+ln.Addr().String()+"/metrics"))
	ln = netutil.LimitListener(ln, 16)
	g := metrics.NewRegistry(metrics.NewSource(reg, wat), os.Getpagesize())
	limit := HealthLimit(cfg.Writeback.AttemptTimeout)
	probes := metrics.Probes{Live: Liveness(RegistryHealth(reg, limit), limit), Ready: ready}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := metrics.Serve(ctx, ln, g, probes, log.With(zap.String("component", "metrics"))); err != nil {
			log.Error("metrics server stopped; running without metrics", zap.Error(err))
		}
	}()
	return func() { <-done }
}
