package service

import (
	"io"
	"os"

	"go.uber.org/zap"
	"go.uber.org/zap/buffer"
	"go.uber.org/zap/zapcore"
)

// NewLogger logs to w at level, in format: "console" (the level, the
// message and the fields as one JSON object, tab-separated) or "json"
// (each line one JSON object: level, ts, msg and the fields). Under
// systemd (JOURNAL_STREAM set) it writes no timestamp, since the journal
// adds its own, and starts each line with the sd-daemon(3) priority
// prefix ("<3>" error, "<4>" warning, "<6>" info, "<7>" debug), which the
// journal maps to the entry's priority and takes off.
func NewLogger(lvl zapcore.LevelEnabler, format string, w io.Writer) *zap.Logger {
	ec := zap.NewProductionEncoderConfig()
	ec.EncodeTime = zapcore.ISO8601TimeEncoder
	ec.EncodeLevel = zapcore.CapitalLevelEncoder
	if format == "json" {
		ec.EncodeLevel = zapcore.LowercaseLevelEncoder
	}
	journal := os.Getenv("JOURNAL_STREAM") != ""
	if journal {
		ec.TimeKey = ""
	}
	enc := zapcore.NewConsoleEncoder(ec)
	if format == "json" {
		enc = zapcore.NewJSONEncoder(ec)
	}
	if journal {
		enc = journalEncoder{enc}
	}
	return zap.New(zapcore.NewCore(enc, zapcore.Lock(zapcore.AddSync(w)), lvl))
}

// journalEncoder starts each entry with its sd-daemon(3) priority prefix.
type journalEncoder struct{ zapcore.Encoder }

var linePool = buffer.NewPool()

func (e journalEncoder) Clone() zapcore.Encoder { return journalEncoder{e.Encoder.Clone()} }

func (e journalEncoder) EncodeEntry(ent zapcore.Entry, fields []zapcore.Field) (*buffer.Buffer, error) {
	b, err := e.Encoder.EncodeEntry(ent, fields)
	if err != nil {
		return nil, err
	}
	defer b.Free()
	line := linePool.Get()
	line.AppendString(journalPrefix(ent.Level))
	line.Write(b.Bytes())
	return line, nil
}

// journalPrefix is the sd-daemon(3) prefix of level l.
func journalPrefix(l zapcore.Level) string {
	switch {
	case l >= zapcore.ErrorLevel:
		return "<3>" // SD_ERR
	case l == zapcore.WarnLevel:
		return "<4>" // SD_WARNING
	case l <= zapcore.DebugLevel:
		return "<7>" // SD_DEBUG
	}
	return "<6>" // SD_INFO
}
