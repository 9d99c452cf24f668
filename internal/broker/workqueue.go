package broker

import "sync"

// workQueue holds the deliveries waiting for a worker: one first-in,
// first-out lane per topic, served in turn. A worker takes from one lane
// at a time, then that lane goes to the back, so a topic with thousands of
// tasks due at once delays only its own: another topic's delivery waits
// for the next free worker, not for the burst. A spare worker (takeSpare)
// serves only the lanes no worker is on, so it need not wait even that.
type workQueue struct {
	mu    sync.Mutex
	lanes map[string]*lane
	turn  []*lane       // lanes with deliveries, the next to serve first
	avail chan struct{} // a token while some lane may have deliveries
	spare chan struct{} // a token when takeSpare may find a lane
	room  int           // deliveries a lane takes before put blocks
}

type lane struct {
	topic  string
	jobs   []job
	space  chan struct{} // a token when a take made room
	queued bool          // in turn
	busy   int           // takes of the lane not yet done
}

func newWorkQueue(room int) *workQueue {
	return &workQueue{lanes: map[string]*lane{}, avail: make(chan struct{}, 1), spare: make(chan struct{}, 1), room: max(room, 1)}
}

func (q *workQueue) lane(topic string) *lane {
	l := q.lanes[topic]
	if l == nil {
		l = &lane{topic: topic, space: make(chan struct{}, 1)}
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
	signal(q.spare)
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
// returns nil once stop is closed, even with deliveries queued. The caller
// calls done with the topic once it has handled them.
func (q *workQueue) take(limit func(topic string) int, stop <-chan struct{}) []job {
	return q.wait(q.avail, stop, func() int {
		if len(q.turn) == 0 {
			return -1
		}
		return 0
	}, limit)
}

// takeSpare is take for the spare worker: it serves only a lane with no
// backlog, no take on it and no more than one take's worth queued, the
// first such in turn, and leaves the rest to the workers. So a topic's
// burst never keeps the spare worker from another topic's next task.
func (q *workQueue) takeSpare(limit func(topic string) int, stop <-chan struct{}) []job {
	return q.wait(q.spare, stop, func() int {
		for i, l := range q.turn {
			if l.busy == 0 && len(l.jobs) <= max(limit(l.topic), 1) {
				return i
			}
		}
		return -1
	}, limit)
}

// wait waits on token until pick, q.mu held, names a lane of turn, and
// takes from that lane.
func (q *workQueue) wait(token chan struct{}, stop <-chan struct{}, pick func() int, limit func(topic string) int) []job {
	for {
		select {
		case <-stop:
			return nil
		default:
		}
		q.mu.Lock()
		if i := pick(); i >= 0 {
			out := q.takeAt(i, limit)
			q.mu.Unlock()
			return out
		}
		q.mu.Unlock()
		select {
		case <-token:
		case <-stop:
			return nil
		}
	}
}

// takeAt takes up to limit(topic) from the lane turn[i] and sends that
// lane to the back of turn; q.mu is held.
func (q *workQueue) takeAt(i int, limit func(topic string) int) []job {
	l := q.turn[i]
	n := min(len(l.jobs), max(limit(l.topic), 1))
	out := make([]job, n)
	copy(out, l.jobs)
	clear(l.jobs[:n])
	l.jobs = l.jobs[n:]
	if len(l.jobs) == 0 {
		l.jobs = nil // let the array go
	}
	l.busy++
	q.turn = append(q.turn[:i], q.turn[i+1:]...)
	if len(l.jobs) > 0 {
		q.turn = append(q.turn, l)
	} else {
		l.queued = false
	}
	if len(q.turn) > 0 {
		signal(q.avail) // wake another worker for the rest
	}
	signal(l.space)
	return out
}

// done ends a take of topic's lane.
func (q *workQueue) done(topic string) {
	q.mu.Lock()
	q.lanes[topic].busy--
	q.mu.Unlock()
	signal(q.spare)
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
