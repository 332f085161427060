package gate

import (
	"fmt"
	"sync"
	"time"
)

// Throttle records refusals a client can cause at any rate, such as
// connections or queries over a limit, without letting a flood of them
// flood the log: the first of a burst is recorded at once, the rest that
// come within Interval of it are counted and recorded as one record when
// the interval ends, with Count set and the detail saying so. Nothing is
// lost: Close records what is pending. It is safe for concurrent use.
type Throttle struct {
	rec      Recorder
	interval time.Duration

	mu      sync.Mutex
	pending map[throttleKey]*throttled
	closed  bool
}

// DefaultThrottleInterval is the interval the data plane uses.
const DefaultThrottleInterval = time.Second

// throttleKey is what makes two refusals alike: one record stands for
// many only when these agree.
type throttleKey struct {
	proto, dest, name, verdict, rule, detail string
	reason                                   Reason
}

type throttled struct {
	first Record // the burst's first refusal, the template of its summaries
	n     int    // refusals of the current interval, not yet recorded
	timer *time.Timer
}

// NewThrottle returns a throttle handing its records to rec, which must not
// be nil.
func NewThrottle(rec Recorder, interval time.Duration) *Throttle {
	return &Throttle{rec: rec, interval: interval, pending: make(map[throttleKey]*throttled)}
}

// Record records r now, or counts it when a record like it went out less
// than the interval ago.
func (t *Throttle) Record(r Record) {
	k := throttleKey{r.Proto, r.Dest, r.Name, r.Verdict, r.Rule, r.Detail, r.Reason}
	t.mu.Lock()
	if p, ok := t.pending[k]; ok && !t.closed {
		p.n++
		t.mu.Unlock()
		return
	}
	if !t.closed {
		p := &throttled{first: r}
		p.timer = time.AfterFunc(t.interval, func() { t.flush(k, p) })
		t.pending[k] = p
	}
	t.mu.Unlock()
	t.rec.Record(r)
}

// flush ends one interval: the refusals counted in it become one record,
// and a new interval starts from it; an interval with none ends the burst.
func (t *Throttle) flush(k throttleKey, p *throttled) {
	t.mu.Lock()
	if t.pending[k] != p {
		t.mu.Unlock()
		return
	}
	n := p.n
	if n == 0 || t.closed {
		delete(t.pending, k)
		t.mu.Unlock()
		if n > 0 {
			t.rec.Record(summary(p.first, n, t.interval))
		}
		return
	}
	p.n = 0
	p.timer.Reset(t.interval)
	t.mu.Unlock()
	t.rec.Record(summary(p.first, n, t.interval))
}

// summary is the record standing for n refusals like first.
func summary(first Record, n int, interval time.Duration) Record {
	r := first
	r.Time = time.Now().UTC()
	r.Count = n
	r.Detail = fmt.Sprintf("%s (%d like it within %v, recorded as one)", first.Detail, n, interval)
	if first.Detail == "" {
		r.Detail = fmt.Sprintf("%d like it within %v, recorded as one", n, interval)
	}
	return r
}

// Close records every pending count at once; later refusals are recorded
// one by one.
func (t *Throttle) Close() {
	t.mu.Lock()
	t.closed = true
	var out []Record
	for k, p := range t.pending {
		p.timer.Stop()
		if p.n > 0 {
			out = append(out, summary(p.first, p.n, t.interval))
		}
		delete(t.pending, k)
	}
	t.mu.Unlock()
	for _, r := range out {
		t.rec.Record(r)
	}
}
