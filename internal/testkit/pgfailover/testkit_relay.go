package pgfailover

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// relay forwards TCP from a loopback port to a target it can switch (the
// VIP or DNS name a failover moves), and can stop forwarding bytes without
// closing anything (a link that black-holes traffic: TCP stays up, nothing
// arrives). The client relay uses switch+drop; the replication relay uses
// pause/resume.
type relay struct {
	ln   net.Listener
	addr string

	mu     sync.Mutex
	cond   *sync.Cond // signalled when paused turns false or the relay closes
	target string
	paused bool
	closed bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// dialTimeout bounds a relay's dial of its target: a dead target on
// loopback refuses at once; this only guards against a wedged one.
const dialTimeout = 5 * time.Second

func newRelay(target string) (*relay, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("relay: listening on loopback: %w", err)
	}
	r := &relay{ln: ln, addr: ln.Addr().String(), target: target, conns: make(map[net.Conn]struct{})}
	r.cond = sync.NewCond(&r.mu)
	r.wg.Add(1)
	go r.accept()
	return r, nil
}

// Addr is the relay's 127.0.0.1:port.
func (r *relay) Addr() string { return r.addr }

func (r *relay) accept() {
	defer r.wg.Done()
	for {
		in, err := r.ln.Accept()
		if err != nil {
			return // closed
		}
		r.mu.Lock()
		target, closed := r.target, r.closed
		r.mu.Unlock()
		if closed {
			_ = in.Close()
			return
		}
		out, err := net.DialTimeout("tcp", target, dialTimeout)
		if err != nil {
			_ = in.Close() // the client sees the target's refusal as a closed connection
			continue
		}
		if !r.track(in, out) {
			continue
		}
		r.wg.Add(2)
		go r.pipe(out, in)
		go r.pipe(in, out)
	}
}

// track registers a connection pair unless the relay closed meanwhile.
func (r *relay) track(in, out net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		_, _ = in.Close(), out.Close()
		return false
	}
	r.conns[in], r.conns[out] = struct{}{}, struct{}{}
	return true
}

// pipe copies src to dst, holding each chunk while the relay is paused: a
// chunk read during a pause is never written unless the relay resumes, so
// bytes the sender wrote after pause returned do not arrive.
func (r *relay) pipe(dst, src net.Conn) {
	defer r.wg.Done()
	defer r.closePair(dst, src)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !r.waitOpen(dst) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // io.EOF or a closed conn: either way this direction is done
		}
	}
}

// waitOpen blocks while paused; false once the relay is closed or dst was
// dropped (a held chunk is then discarded, never delivered late).
func (r *relay) waitOpen(dst net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		if _, live := r.conns[dst]; r.closed || !live {
			return false
		}
		if !r.paused {
			return true
		}
		r.cond.Wait()
	}
}

func (r *relay) closePair(a, b net.Conn) {
	r.mu.Lock()
	delete(r.conns, a)
	delete(r.conns, b)
	r.mu.Unlock()
	_, _ = a.Close(), b.Close()
}

// Pause stops forwarding in both directions; connections stay open.
func (r *relay) Pause() {
	r.mu.Lock()
	r.paused = true
	r.mu.Unlock()
}

// Resume forwards again, held chunks first.
func (r *relay) Resume() {
	r.mu.Lock()
	r.paused = false
	r.mu.Unlock()
	r.cond.Broadcast()
}

// Switch sends new connections to target and closes every existing one,
// discarding held bytes: what clients see when a VIP moves.
func (r *relay) Switch(target string) {
	r.mu.Lock()
	r.target = target
	r.mu.Unlock()
	r.Drop()
}

// Drop closes every current connection; new ones are still accepted.
func (r *relay) Drop() {
	r.mu.Lock()
	conns := make([]net.Conn, 0, len(r.conns))
	for c := range r.conns {
		conns = append(conns, c)
		delete(r.conns, c)
	}
	r.mu.Unlock()
	r.cond.Broadcast() // wakes pipes held by a pause so they see the drop
	for _, c := range conns {
		_ = c.Close()
	}
}

// Close stops accepting, closes every connection and waits for the relay's
// goroutines, so none outlives the test.
func (r *relay) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	r.mu.Unlock()
	r.cond.Broadcast()
	err := r.ln.Close()
	r.Drop()
	r.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

var _ io.Closer = (*relay)(nil)
