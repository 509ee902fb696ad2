package bdi

import (
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// sampleTick is errLog's sampling period: at most 5 lines of one message
// get through in each.
const sampleTick = 10 * time.Second

// sampledLog logs per-file error lines: at most 5 of one message per
// sampleTick get through, and it counts those it leaves out (suppressed).
type sampledLog struct {
	*zap.Logger
	suppressed atomic.Uint64
	// saidAt is when (daemon clock) Writeback.logSuppressed last said
	// how many were left out; said: it has. The writeback goroutine's.
	saidAt time.Duration
	said   bool
}

// newSampledLog returns log with sampling.
func newSampledLog(log *zap.Logger) *sampledLog {
	s := &sampledLog{}
	s.Logger = log.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewSamplerWithOptions(c, sampleTick, 5, 0, zapcore.SamplerHook(func(_ zapcore.Entry, d zapcore.SamplingDecision) {
			if d&zapcore.LogDropped != 0 {
				s.suppressed.Add(1)
			}
		}))
	}))
	return s
}
