package cli

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/redis/go-redis/v9"
)

// RouteLibraryLogs sends what go-redis logs through logger, so that
// --log-format json gives a stream of JSON lines a log pipeline can parse:
// by default go-redis prints its own plain-text lines to the process's
// stderr ("redis: 2026/12/01 20:38:22 pool.go:770: …"), which break it.
// Each command calls it right after building its logger.
//
// go-redis's logger is one process-wide setting; the last command to call
// this wins, which is the only one in a pelguard binary. Tests that run
// several commands in one process share it: a go-redis line of one may land
// in another's log (never a secret: the handler redacts, and go-redis
// prints no URLs).
//
// stripe-go needs nothing here: stripeapi gives every client its own
// leveled logger (slog, or silent), so stripe-go never falls back to its
// default stderr logger.
func RouteLibraryLogs(logger *slog.Logger) {
	if logger == nil {
		return
	}
	redis.SetLogger(redisLogger{logger})
	primaryLogger.Store(logger)
}

// redisLogger implements go-redis v9's internal.Logging (Printf with a
// context). go-redis logs what it cannot return as an error (dial failures
// in its background pool, hook failures, recovered panics): a warning. Its
// Sentinel client also reports its routine work (a sentinel selected or
// discovered, a new master followed): information, since pelguard logs its
// own warning, once, when the primary changes.
type redisLogger struct{ l *slog.Logger }

// routineSentinel are the starts of go-redis's routine Sentinel lines.
var routineSentinel = []string{"sentinel: new master", "sentinel: discovered new sentinel",
	"sentinel: selected addr", "sentinel: ignore addr"}

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	msg := strings.TrimSpace(strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: "))
	level := slog.LevelWarn
	for _, p := range routineSentinel {
		if strings.HasPrefix(msg, p) {
			level = slog.LevelInfo
		}
	}
	// The text goes in msg, which the handler's ReplaceAttr redacts like
	// any other string (a URL with a password would be masked).
	r.l.LogAttrs(ctx, level, msg, slog.String("library", "go-redis"))
}
