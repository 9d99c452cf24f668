package broker

import "sync"

// workQueue holds the deliveries waiting for a worker: one first-in,
// first-out lane per topic, served in turn. A worker takes from one lane
// at a time, then that lane goes to the back, so a topic with thousands of
// tasks due at once delays only its own: another topic's delivery waits
// for the next free worker, not for the burst.
type workQueue struct {
	mu    sync.Mutex
	lanes map[string]*lane
	turn  []*lane       // lanes with deliveries, the next to serve first
	avail chan struct{} // a token while some lane may have deliveries
	room  int           // deliveries a lane takes before put blocks
}

type lane struct {
	jobs   []job
	space  chan struct{} // a token when a take made room
	queued bool          // in turn
}

func newWorkQueue(room int) *workQueue {
	return &workQueue{lanes: map[string]*lane{}, avail: make(chan struct{}, 1), room: max(room, 1)}
}

func (q *workQueue) lane(topic string) *lane {
	l := q.lanes[topic]
	if l == nil {
		l = &lane{space: make(chan struct{}, 1)}
		q.lanes[topic] = l
	}
	return l
}

// add appends j to its lane; q.mu is held.
func (q *workQueue) add(l *lane, j job) {
	l.jobs = append(l.jobs, j)
	if !l.queued {
		l.queued = true
		q.turn = append(q.turn, l)
	}
	signal(q.avail)
}

// put queues j, waiting while its lane holds room deliveries already: the
// rest stay in the broker meanwhile. It reports false, j not queued, once
// stop is closed.
func (q *workQueue) put(j job, stop <-chan struct{}) bool {
	for {
		q.mu.Lock()
		l := q.lane(j.topic)
		if len(l.jobs) < q.room {
			q.add(l, j)
			if len(l.jobs) < q.room {
				signal(l.space) // another putter may be waiting
			}
			q.mu.Unlock()
			return true
		}
		q.mu.Unlock()
		select {
		case <-l.space:
		case <-stop:
			return false
		}
	}
}

// putHeld queues j whatever its lane holds: a held message is in memory
// already, and the one goroutine releasing them must not wait on one
// topic while another's come due.
func (q *workQueue) putHeld(j job) {
	q.mu.Lock()
	q.add(q.lane(j.topic), j)
	q.mu.Unlock()
}

// take waits for deliveries and returns up to limit(topic) of the lane
// whose turn it is, all of one topic, in the order they were queued. It
// returns nil once stop is closed, even with deliveries queued.
func (q *workQueue) take(limit func(topic string) int, stop <-chan struct{}) []job {
	for {
		select {
		case <-stop:
			return nil
		default:
		}
		q.mu.Lock()
		if len(q.turn) > 0 {
			l := q.turn[0]
			n := min(len(l.jobs), max(limit(l.jobs[0].topic), 1))
			out := make([]job, n)
			copy(out, l.jobs)
			clear(l.jobs[:n])
			l.jobs = l.jobs[n:]
			if len(l.jobs) == 0 {
				l.jobs = nil // let the array go
			}
			q.turn = q.turn[1:]
			if len(l.jobs) > 0 {
				q.turn = append(q.turn, l)
			} else {
				l.queued = false
			}
			if len(q.turn) > 0 {
				signal(q.avail) // wake another worker for the rest
			}
			signal(l.space)
			q.mu.Unlock()
			return out
		}
		q.mu.Unlock()
		select {
		case <-q.avail:
		case <-stop:
			return nil
		}
	}
}

// drain removes and returns every queued delivery.
func (q *workQueue) drain() []job {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []job
	for _, l := range q.turn {
		out = append(out, l.jobs...)
		l.jobs, l.queued = nil, false
		signal(l.space)
	}
	q.turn = nil
	return out
}

// signal leaves a token in ch (capacity 1) unless one is there.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
