package chaos

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pelguard/pelguard/internal/meterledger"
)

// A pelguard usage cell needs a migrated schema with meter_events' daily
// partitions (38 of them: Stripe's 35 days, a day of margin, two ahead),
// which takes a second or two of DDL. The drill makes them in the
// background while the charge scenarios run, so the usage scenarios do not
// wait for them. Migrations are serialised database-wide (goose's advisory
// lock), so a schema made while a charge cell makes its own would delay
// that cell: the background makes one schema per charge cell, after the
// cell has its schema (step), and the rest once the usage scenarios begin
// (release).

// preparedSchema is a pelguard usage cell's schema, made ahead.
type preparedSchema struct {
	pool   *pgxpool.Pool
	url    string
	schema string
	err    error
}

// schemaPrep makes the usage scenarios' pelguard schemas in the background.
type schemaPrep struct {
	ready  map[string]chan preparedSchema
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// steps lets one schema be made; released lets all the rest be.
	steps       chan struct{}
	released    chan struct{}
	releaseOnce sync.Once
}

// prepareUsageSchemas starts making a schema for each usage scenario of
// scenarios (suffix "u<i>"), in order. wait must be called before the
// drill removes its schemas.
func (d *drill) prepareUsageSchemas(ctx context.Context, scenarios []string) *schemaPrep {
	ctx, cancel := context.WithCancel(ctx)
	p := &schemaPrep{ready: map[string]chan preparedSchema{}, cancel: cancel,
		steps: make(chan struct{}, len(scenarios)), released: make(chan struct{})}
	var todo []string
	for _, sc := range scenarios {
		if sc == ScenarioUsageAOFRollback && redisServerMissing() != "" {
			continue // skipped: Run says why
		}
		if isUsage(sc) {
			p.ready[sc] = make(chan preparedSchema, 1)
			todo = append(todo, sc)
		}
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for i, sc := range todo {
			select {
			case <-p.steps:
			case <-p.released:
			case <-ctx.Done():
			}
			var ps preparedSchema
			ps.pool, ps.url, ps.schema, ps.err = d.newSchema(ctx, fmt.Sprintf("u%d", i))
			if ps.err == nil {
				ps.err = ensurePartitions(ctx, ps.pool, ps.schema)
			}
			if ps.err != nil && ps.pool != nil {
				ps.pool.Close()
				ps.pool = nil
			}
			p.ready[sc] <- ps
		}
	}()
	return p
}

func ensurePartitions(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	l, err := meterledger.New(pool, meterledger.Config{Schema: schema})
	if err != nil {
		return err
	}
	if _, err := l.EnsurePartitions(ctx, time.Now()); err != nil {
		return fmt.Errorf("making meter_events' partitions in %s: %w", schema, err)
	}
	return nil
}

// step lets the background make one schema: a charge cell has made its own.
func (p *schemaPrep) step() {
	select {
	case p.steps <- struct{}{}:
	default:
	}
}

// release lets the background make every schema left.
func (p *schemaPrep) release() { p.releaseOnce.Do(func() { close(p.released) }) }

// take returns scenario's schema once it is made; the caller owns its pool.
func (p *schemaPrep) take(ctx context.Context, scenario string) (preparedSchema, error) {
	p.release()
	ch, ok := p.ready[scenario]
	if !ok {
		return preparedSchema{}, fmt.Errorf("no schema prepared for %s", scenario)
	}
	select {
	case ps := <-ch:
		return ps, ps.err
	case <-ctx.Done():
		return preparedSchema{}, ctx.Err()
	}
}

// wait stops the preparation and closes the pools no cell took (a skipped
// or interrupted scenario); the schemas themselves are the drill's to drop.
func (p *schemaPrep) wait() {
	p.cancel()
	p.wg.Wait()
	for _, ch := range p.ready {
		select {
		case ps := <-ch:
			if ps.pool != nil {
				ps.pool.Close()
			}
		default:
		}
	}
}
