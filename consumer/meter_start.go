package consumer

import (
	"context"
	"errors"
	"io"
	"net"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// untilAnswered runs fn, a start-up step that is safe to repeat (making
// partitions, the send fence), until it succeeds, fails for another
// reason than a lost connection (returned), or ctx ends (nil). A
// connection lost on the way (the pooler or the server restarted while
// the consumer started) is tried again after a pause of up to 5 s, with a
// warning: one lost connection does not stop the consumer.
func (c *MeterConsumer) untilAnswered(ctx context.Context, what string, fn func() error) error {
	for try := 1; ; try++ {
		err := fn()
		switch {
		case err == nil || ctx.Err() != nil:
			return nil
		case !connLost(err):
			return err
		}
		delay := min(time.Duration(try)*250*time.Millisecond, 5*time.Second)
		c.cfg.Logger.Warn(what+": lost the ledger's connection; trying again", "stream", c.cfg.Stream, "try", try,
			"retry_in", delay.String(), "err", err)
		sleep(ctx, delay)
	}
}

// connLost reports an error of the connection, not an answer of Postgres.
func connLost(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return false
	}
	var opErr *net.OpError
	var connErr *pgconn.ConnectError
	return pgconn.SafeToRetry(err) || pgconn.Timeout(err) || errors.Is(err, pgconn.ErrConnClosed) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &opErr) || errors.As(err, &connErr)
}
