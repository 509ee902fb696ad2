package service

import (
	"fmt"
	"io"
	"os"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// NewLogger logs to w at level. Under systemd (JOURNAL_STREAM set) it
// writes no timestamp, since the journal adds its own, and starts each line
// with the sd-daemon(3) priority prefix ("<3>" error, "<4>" warning, "<6>"
// info, "<7>" debug), which the journal maps to the entry's priority.
func NewLogger(lvl zapcore.LevelEnabler, w io.Writer) *zap.Logger {
	ec := zap.NewProductionEncoderConfig()
	ec.EncodeTime = zapcore.ISO8601TimeEncoder
	ec.EncodeLevel = zapcore.CapitalLevelEncoder
	if os.Getenv("JOURNAL_STREAM") != "" {
		ec.TimeKey = ""
		ec.EncodeLevel = journalLevel
	}
	core := zapcore.NewCore(zapcore.NewConsoleEncoder(ec), zapcore.Lock(zapcore.AddSync(w)), lvl)
	return zap.New(core)
}

// journalLevel writes the level with its sd-daemon(3) prefix.
func journalLevel(l zapcore.Level, enc zapcore.PrimitiveArrayEncoder) {
	prio := 6 // SD_INFO
	switch {
	case l >= zapcore.ErrorLevel:
		prio = 3 // SD_ERR
	case l == zapcore.WarnLevel:
		prio = 4 // SD_WARNING
	case l <= zapcore.DebugLevel:
		prio = 7 // SD_DEBUG
	}
	enc.AppendString(fmt.Sprintf("<%d>%s", prio, l.CapitalString()))
}
