package rabbit

import (
	"net"
	"sync"
	"time"
)

// maxQueuedWrite bounds the bytes a writeBehindConn holds before Write
// waits for the socket, so a broker that stops reading (a memory alarm)
// still pushes back on publishers through TCP.
const maxQueuedWrite = 1 << 20

// closeDrainWait is how long Close lets queued bytes (the connection.close
// frame among them) reach the socket before it closes it anyway.
const closeDrainWait = time.Second

// writeBehindConn is a net.Conn whose Write queues the bytes and returns;
// one goroutine writes everything queued meanwhile in a single system
// call. amqp091-go flushes once per published message and once per ack,
// each a write(2) and a TCP segment the broker must read on its own; under
// load this turns thousands of those a second into a few large ones,
// which saves CPU on both ends, and adds no wait when idle: the writer
// goroutine sends a lone frame as soon as it is queued.
//
// Write reports a failure of an earlier write; the connection's reader
// notices the dead socket as well, and amqp091-go then closes the
// connection, so publishes that were queued but never written are left
// unconfirmed and reported as lost, exactly as when the socket dies
// after a write.
type writeBehindConn struct {
	net.Conn

	mu      sync.Mutex
	room    *sync.Cond // broadcast when the writer took the queue, failed or closed
	queue   []byte
	err     error
	closing bool
	wake    chan struct{} // capacity 1: work is queued or Close was called
	done    chan struct{} // closed when the writer goroutine returns
}

func newWriteBehindConn(c net.Conn) *writeBehindConn {
	w := &writeBehindConn{Conn: c, wake: make(chan struct{}, 1), done: make(chan struct{})}
	w.room = sync.NewCond(&w.mu)
	go w.writer()
	return w
}

func (w *writeBehindConn) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// Write queues p for the writer goroutine, waiting while the queue is full.
func (w *writeBehindConn) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for w.err == nil && !w.closing && len(w.queue) > 0 && len(w.queue)+len(p) > maxQueuedWrite {
		w.room.Wait()
	}
	if w.closing {
		return 0, net.ErrClosed
	}
	if w.err != nil {
		return 0, w.err
	}
	w.queue = append(w.queue, p...)
	w.signal()
	return len(p), nil
}

// writer writes the queue out until the socket fails or Close drained it.
func (w *writeBehindConn) writer() {
	defer close(w.done)
	var out []byte
	for range w.wake {
		for {
			w.mu.Lock()
			out, w.queue = w.queue, out[:0]
			closing := w.closing
			w.room.Broadcast()
			w.mu.Unlock()
			if len(out) == 0 {
				if closing {
					return
				}
				break
			}
			if _, err := w.Conn.Write(out); err != nil {
				w.mu.Lock()
				w.err = err
				w.room.Broadcast()
				w.mu.Unlock()
				return
			}
		}
	}
}

// Close lets the queued bytes reach the socket for up to closeDrainWait,
// then closes it, which also ends a write stuck on a dead peer.
func (w *writeBehindConn) Close() error {
	w.mu.Lock()
	already := w.closing
	w.closing = true
	w.room.Broadcast()
	w.mu.Unlock()
	if already {
		return net.ErrClosed
	}
	w.signal()
	t := time.NewTimer(closeDrainWait)
	select {
	case <-w.done:
	case <-t.C:
	}
	t.Stop()
	err := w.Conn.Close()
	<-w.done
	return err
}
