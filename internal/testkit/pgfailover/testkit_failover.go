package pgfailover

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"
)

// ErrNothingLost is FailoverLosingCommits' refusal when the replica already
// has the primary's last commit: the drill would lose nothing and a test
// of loss detection could pass without detecting anything.
var ErrNothingLost = errors.New("pgfailover: the replica has the primary's last commit, so this failover would lose nothing (stall replication, then commit on the primary, before failing over)")

// WaitReplicaCaughtUp waits until the replica has replayed everything the
// primary had written when it was called.
func (c *Cluster) WaitReplicaCaughtUp(ctx context.Context) error {
	primary, replica := c.Primary(), c.Replica()
	if replica == nil {
		return errors.New("pgfailover: no replica (already promoted)")
	}
	pconn, err := connect(ctx, primary)
	if err != nil {
		return err
	}
	defer pconn.Close(context.WithoutCancel(ctx))
	target, err := CurrentWALLSN(ctx, pconn)
	if err != nil {
		return fmt.Errorf("primary: %w", err)
	}
	rconn, err := connect(ctx, replica)
	if err != nil {
		return err
	}
	defer rconn.Close(context.WithoutCancel(ctx))
	var replayed LSN
	for {
		var s *string
		err := rconn.QueryRow(ctx, "SELECT pg_last_wal_replay_lsn()::text").Scan(&s)
		if err == nil && s != nil {
			if replayed, err = ParseLSN(*s); err == nil && replayed >= target {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgfailover: the replica replayed up to %v, not the primary's %v (stalled: %v; replica log %s ends:\n%s): %w",
				replayed, target, c.isStalled(), replica.LogFile, tail(replica.LogFile), ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// StallReplication waits until the replica has replayed what the primary
// has written so far, then stops forwarding replication bytes both ways
// while keeping the connection up: the primary keeps committing
// (asynchronous replication waits for no one) and the replica receives
// nothing. Commits that returned before the call are on the replica;
// commits made after it returns are not, until ResumeReplication.
func (c *Cluster) StallReplication(ctx context.Context) error {
	if err := c.WaitReplicaCaughtUp(ctx); err != nil {
		return err
	}
	c.repl.Pause()
	c.mu.Lock()
	c.stalled = true
	c.mu.Unlock()
	return nil
}

// ResumeReplication forwards replication again; the replica catches up.
func (c *Cluster) ResumeReplication() {
	c.repl.Resume()
	c.mu.Lock()
	c.stalled = false
	c.mu.Unlock()
}

func (c *Cluster) isStalled() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stalled
}

// KillPrimary stops the primary immediately (SIGQUIT to the postmaster,
// as `pg_ctl stop -m immediate` does): no shutdown checkpoint, nothing
// more sent to the replica, every client connection cut.
func (c *Cluster) KillPrimary() error {
	p := c.Primary()
	if !p.Running() {
		return fmt.Errorf("pgfailover: the %s is not running", p.Name)
	}
	if err := p.stop(syscall.SIGQUIT, c.opts.Timeout); err != nil {
		return fmt.Errorf("pgfailover: killing the primary: %w", err)
	}
	return nil
}

// Promote promotes the replica (pg_promote, which ends recovery after
// replaying what it received), waits until pg_is_in_recovery() is false,
// then checkpoints so that pg_control_checkpoint() — TimelineID — reports
// the new timeline at once instead of after the next timed checkpoint. The
// replica is the primary from then on; clients reach it after Failover.
func (c *Cluster) Promote(ctx context.Context) error {
	replica := c.Replica()
	if replica == nil {
		return errors.New("pgfailover: no replica to promote (already promoted)")
	}
	ctx, cancel := context.WithTimeout(ctx, c.opts.Timeout)
	defer cancel()
	conn, err := connect(ctx, replica)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var promoted bool
	if err := conn.QueryRow(ctx, "SELECT pg_promote(true, $1)", int(c.opts.Timeout.Seconds())).Scan(&promoted); err != nil {
		return fmt.Errorf("pgfailover: pg_promote: %w", err)
	}
	for {
		var inRecovery bool
		err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery)
		if err == nil && !inRecovery {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgfailover: the replica is still in recovery (pg_promote said %v; last error %v; log %s ends:\n%s): %w",
				promoted, err, replica.LogFile, tail(replica.LogFile), ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	if _, err := conn.Exec(ctx, "CHECKPOINT"); err != nil {
		return fmt.Errorf("pgfailover: checkpoint after promotion: %w", err)
	}
	c.mu.Lock()
	c.oldPrime, c.primary, c.replica = c.primary, replica, nil
	c.mu.Unlock()
	return nil
}

// Failover points the relay behind URL at the current primary and closes
// every connection it carries, as a VIP move or DNS change does. The
// replication link's connections are cut too, discarding what a stall held.
func (c *Cluster) Failover() {
	c.client.Switch(c.Primary().Addr())
	c.repl.Drop()
}

// Loss is what FailoverLosingCommits threw away: the old primary was ahead
// of the replica by these WAL positions and commits.
type Loss struct {
	PrimaryLSN, ReplicaLSN LSN    // the primary's written WAL; what the replica received
	PrimaryXID, ReplicaXID uint32 // the last transaction each had committed (pg_last_committed_xact)
}

// Bytes is how far the replica's WAL was behind.
func (l Loss) Bytes() uint64 {
	if l.PrimaryLSN < l.ReplicaLSN {
		return 0
	}
	return uint64(l.PrimaryLSN - l.ReplicaLSN)
}

// FailoverLosingCommits drills the failover issue 26 is about: with
// replication stalled (it stalls it if the caller has not), it checks that
// the primary holds a commit the replica lacks (else ErrNothingLost), kills
// the primary, promotes the replica and moves URL to it. The usual order:
//
//	c.StallReplication(ctx); write through c.URL(); c.FailoverLosingCommits(ctx)
func (c *Cluster) FailoverLosingCommits(ctx context.Context) (Loss, error) {
	if !c.isStalled() {
		if err := c.StallReplication(ctx); err != nil {
			return Loss{}, err
		}
	}
	loss, err := c.measureLoss(ctx)
	if err != nil {
		return loss, err
	}
	if loss.PrimaryXID == loss.ReplicaXID {
		return loss, ErrNothingLost
	}
	if err := c.KillPrimary(); err != nil {
		return loss, err
	}
	if err := c.Promote(ctx); err != nil {
		return loss, err
	}
	c.Failover()
	return loss, nil
}

func (c *Cluster) measureLoss(ctx context.Context) (Loss, error) {
	var l Loss
	ctx, cancel := context.WithTimeout(ctx, c.opts.Timeout)
	defer cancel()
	primary, replica := c.Primary(), c.Replica()
	if replica == nil {
		return l, errors.New("pgfailover: no replica (already promoted)")
	}
	pconn, err := connect(ctx, primary)
	if err != nil {
		return l, err
	}
	defer pconn.Close(context.WithoutCancel(ctx))
	rconn, err := connect(ctx, replica)
	if err != nil {
		return l, err
	}
	defer rconn.Close(context.WithoutCancel(ctx))
	var plsn, rlsn string
	var pxid, rxid *int64 // NULL before the first commit
	if err := pconn.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text, (SELECT xid::text::bigint FROM pg_last_committed_xact())`).Scan(&plsn, &pxid); err != nil {
		return l, fmt.Errorf("pgfailover: reading the primary's position: %w", err)
	}
	if err := rconn.QueryRow(ctx, `SELECT coalesce(pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn())::text, (SELECT xid::text::bigint FROM pg_last_committed_xact())`).Scan(&rlsn, &rxid); err != nil {
		return l, fmt.Errorf("pgfailover: reading the replica's position: %w", err)
	}
	if l.PrimaryLSN, err = ParseLSN(plsn); err != nil {
		return l, err
	}
	if l.ReplicaLSN, err = ParseLSN(rlsn); err != nil {
		return l, err
	}
	if pxid != nil {
		l.PrimaryXID = uint32(*pxid)
	}
	if rxid != nil {
		l.ReplicaXID = uint32(*rxid)
	}
	return l, nil
}
