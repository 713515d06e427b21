package cli

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Logger makes the process logger: JSON, or human console output when
// format is "console" or "auto" on a terminal.
func Logger(format, level string, out *os.File) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(strings.ToLower(level))
	if err != nil || level == "" {
		return zerolog.Logger{}, fmt.Errorf("--log-level %q is not one of debug, info, warn, error", level)
	}
	var w io.Writer = out
	switch format {
	case "json":
	case "console":
		w = zerolog.ConsoleWriter{Out: out, TimeFormat: time.RFC3339Nano}
	case "auto", "":
		if isatty.IsTerminal(out.Fd()) {
			w = zerolog.ConsoleWriter{Out: out, TimeFormat: "15:04:05.000"}
		}
	default:
		return zerolog.Logger{}, fmt.Errorf("--log-format %q is not one of json, console, auto", format)
	}
	zerolog.TimeFieldFormat = time.RFC3339Nano
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger(), nil
}

// KafkaLogger adapts zerolog to the franz-go client logger (franz-go has no
// zerolog plugin on the module proxy; this is the 20 lines one would be).
func KafkaLogger(log zerolog.Logger, level kgo.LogLevel) kgo.Logger {
	return kafkaLogger{log: log.With().Str("component", "kafka-client").Logger(), level: level}
}

type kafkaLogger struct {
	log   zerolog.Logger
	level kgo.LogLevel
}

func (l kafkaLogger) Level() kgo.LogLevel { return l.level }

func (l kafkaLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	var e *zerolog.Event
	switch level {
	case kgo.LogLevelError:
		e = l.log.Error()
	case kgo.LogLevelWarn:
		e = l.log.Warn()
	case kgo.LogLevelInfo:
		e = l.log.Info()
	default:
		e = l.log.Debug()
	}
	for i := 0; i+1 < len(keyvals); i += 2 {
		e = e.Interface(fmt.Sprint(keyvals[i]), keyvals[i+1])
	}
	e.Msg(msg)
}
