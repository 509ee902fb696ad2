package bdi

import (
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// sampledLog logs per-file error lines: at most 5 of one message per 10 s
// get through, and it counts those it leaves out (suppressed).
type sampledLog struct {
	*zap.Logger
	suppressed atomic.Uint64
}

// newSampledLog returns log with sampling.
func newSampledLog(log *zap.Logger) *sampledLog {
	s := &sampledLog{}
	s.Logger = log.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewSamplerWithOptions(c, 10*time.Second, 5, 0, zapcore.SamplerHook(func(_ zapcore.Entry, d zapcore.SamplingDecision) {
			if d&zapcore.LogDropped != 0 {
				s.suppressed.Add(1)
			}
		}))
	}))
	return s
}
