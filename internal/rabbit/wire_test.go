package rabbit

import (
	"bytes"
	"errors"
	"github.com/delaybridge/delaybridge/internal/testutil"
	"io"
	"net"
	"testing"
	"time"
)

func TestWriteBehindConn_DeliversEveryWriteInOrder(t *testing.T) {
	a, b := net.Pipe()
	w := newWriteBehindConn(a)
	var want bytes.Buffer
	got := make(chan []byte, 1)
	go func() { data, _ := io.ReadAll(b); got <- data }()
	for i := range 5000 {
		p := bytes.Repeat([]byte{byte(i)}, 1+i%300)
		want.Write(p)
		if n, err := w.Write(p); n != len(p) || err != nil {
			t.Fatalf("write %d: n=%d err=%v", i, n, err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if data := <-got; !bytes.Equal(data, want.Bytes()) {
		t.Fatalf("peer read %d bytes, want the %d written in order", len(data), want.Len())
	}
}

func TestWriteBehindConn_QueueFullWaitsForTheSocket(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	w := newWriteBehindConn(a)
	defer w.Close()
	// Nobody reads b: the writer goroutine blocks in its first write and
	// the queue fills to maxQueuedWrite.
	chunk := make([]byte, 64<<10)
	wrote := make(chan int, 1)
	go func() {
		n := 0
		for n < 3*maxQueuedWrite {
			if _, err := w.Write(chunk); err != nil {
				break
			}
			n += len(chunk)
		}
		wrote <- n
	}()
	select {
	case n := <-wrote:
		t.Fatalf("%d bytes accepted while the peer read nothing", n)
	case <-time.After(300 * time.Millisecond):
	}
	go func() { _, _ = io.Copy(io.Discard, b) }()
	select {
	case n := <-wrote:
		if n < 3*maxQueuedWrite {
			t.Fatalf("writes stopped at %d bytes", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("writes stayed blocked after the peer started reading")
	}
}

func TestWriteBehindConn_WriteReportsADeadSocket(t *testing.T) {
	a, b := net.Pipe()
	w := newWriteBehindConn(a)
	defer w.Close()
	b.Close()
	var err error
	if !testutil.Eventually(5*time.Second, time.Millisecond, func() bool {
		_, err = w.Write([]byte("frame"))
		return err != nil
	}) {
		t.Fatal("writes to a closed peer kept succeeding")
	}
	if !errors.Is(err, io.ErrClosedPipe) {
		t.Fatalf("err = %v, want the socket's io.ErrClosedPipe", err)
	}
}

func TestWriteBehindConn_CloseEndsAStuckWriteAndRefusesMore(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	w := newWriteBehindConn(a)
	if _, err := w.Write([]byte("never read")); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := w.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if took := time.Since(start); took > closeDrainWait+2*time.Second {
		t.Fatalf("Close took %v with a peer that never reads", took)
	}
	if _, err := w.Write([]byte("late")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write after Close: %v, want net.ErrClosed", err)
	}
	if err := w.Close(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("second Close: %v, want net.ErrClosed", err)
	}
}
