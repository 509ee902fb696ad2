package service

import (
	"context"
	"fmt"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"go.uber.org/zap"

	"flusherd/bdi"
)

// Health is one device's writeback goroutine as the watchdog sees it.
type Health struct {
	Name    string
	Healthy bool // bdi.Writeback.Healthy with the watchdog interval
	Stuck   int  // calls past attempt_timeout (bdi.Writeback.StuckCalls)
}

// RegistryHealth reads the health of reg's devices with limit as the
// longest silence of a healthy goroutine, a silence counted from the end
// of the last stop of the whole process at the earliest
// (bdi.Registry.Resumed: a thaw from the cgroup freezer is no wedge).
func RegistryHealth(reg *bdi.Registry, limit time.Duration) func() []Health {
	return func() []Health {
		var hs []Health
		resumed := reg.Resumed()
		for _, wb := range reg.Devices() {
			hs = append(hs, Health{Name: wb.Name, Healthy: wb.HealthySince(limit, resumed), Stuck: wb.StuckCalls()})
		}
		return hs
	}
}

// HealthLimit is the longest silence of a healthy writeback goroutine for
// /healthz: the watchdog's interval under systemd ($WATCHDOG_USEC), else
// three times attempt_timeout (30 s by default, the unit's WatchdogSec=).
func HealthLimit(attemptTimeout time.Duration) time.Duration {
	if interval, err := daemon.SdWatchdogEnabled(false); err == nil && interval > 0 {
		return interval
	}
	return 3 * attemptTimeout
}

// Liveness is /healthz: nil while every device of health() is healthy as
// the watchdog judges it (watchdogRound), else an error naming the first
// wedged one. limit is health's, for the message.
func Liveness(health func() []Health, limit time.Duration) func() error {
	return func() error {
		if sick, _ := watchdogRound(health()); sick != "" {
			return fmt.Errorf("bdi %s: writeback goroutine wedged (no sign of life within %v)", sick, limit)
		}
		return nil
	}
}

// StartWatchdog starts Watchdog on reg's devices when systemd asks for
// pings ($WATCHDOG_USEC, sd_watchdog_enabled(3)); it runs until ctx ends.
// attemptTimeout is writeback.attempt_timeout, for a warning when
// WatchdogSec= is too short for it.
func StartWatchdog(ctx context.Context, reg *bdi.Registry, attemptTimeout time.Duration, n *Notifier, log *zap.Logger) {
	interval, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		log.Warn("WATCHDOG_USEC is set but unusable; no watchdog pings", zap.Error(err))
		return
	}
	if interval <= 0 {
		return
	}
	log.Info("systemd watchdog enabled; pinging while every device's writeback goroutine is healthy", zap.Stringer("interval", interval))
	if interval < 2*attemptTimeout {
		log.Warn("WatchdogSec is less than twice writeback.attempt_timeout: a device waiting out one hung call may look wedged and be restarted",
			zap.Stringer("watchdog", interval), zap.Stringer("attempt_timeout", attemptTimeout))
	}
	go Watchdog(ctx, interval, RegistryHealth(reg, interval), n, log)
}

// Watchdog sends WATCHDOG=1 every interval/2 (sd_watchdog_enabled(3))
// while every device of health() is healthy, so systemd restarts a
// daemon with a wedged writeback goroutine; stuck calls only change
// STATUS=. It returns when ctx ends.
func Watchdog(ctx context.Context, interval time.Duration, health func() []Health, n *Notifier, log *zap.Logger) {
	tick, stop := n.clock.Tick(interval / 2)
	defer stop()
	wedged, lastStatus := "", ""
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
		}
		sick, status := watchdogRound(health())
		if sick != "" {
			if wedged != sick {
				log.Error("a device's writeback goroutine shows no sign of life; not pinging the watchdog", zap.String("bdi", sick), zap.Stringer("limit", interval))
				n.Send("STATUS=writeback goroutine of bdi " + sick + " is wedged")
			}
			wedged = sick
			continue
		}
		wedged = ""
		if status != lastStatus {
			if status == "" {
				n.Send("STATUS=running")
			} else {
				n.Send("STATUS=" + status)
			}
			lastStatus = status
		}
		n.Send(daemon.SdNotifyWatchdog)
	}
}

// watchdogRound names the first unhealthy device ("" for none) and the
// STATUS= text about stuck calls ("" for none).
func watchdogRound(hs []Health) (sick, status string) {
	for _, h := range hs {
		if !h.Healthy && sick == "" {
			sick = h.Name
		}
		if h.Stuck > 0 {
			status += fmt.Sprintf("bdi %s: %d writeback calls stuck past attempt_timeout (frozen or hung filesystem?); ", h.Name, h.Stuck)
		}
	}
	return sick, status
}
