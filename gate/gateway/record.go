package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"flowgate/gate"
)

var (
	decisionsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "flowgate",
		Name:      "decisions_total",
		Help:      "Decisions taken, by protocol, verdict and reason code.",
	}, []string{"proto", "verdict", "reason"})
	tamperTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "flowgate",
		Name:      "table_tamper_events_total",
		Help:      "Changes made to flowgate's nftables table by someone else.",
	})
)

// Collectors returns the gateway's Prometheus metrics, for a caller that
// serves them (flowgate attach --metrics).
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{decisionsTotal, tamperTotal}
}

// recorder stamps each record with the sandbox and uid, counts it, and
// hands it to the caller's recorder: one record feeds log and metrics.
func (h *Handle) recorder(uid uint32) gate.Recorder {
	next := h.opts.Record
	sandbox := h.opts.Sandbox
	return gate.RecorderFunc(func(r gate.Record) {
		r.Sandbox = sandbox
		r.UID = uid
		decisionsTotal.WithLabelValues(r.Proto, r.Verdict, string(r.Reason)).Add(float64(r.Events()))
		if next != nil {
			next.Record(r)
		}
	})
}

// JSONLog writes each record as one JSON line with a single Write, so a
// crash never leaves half a line from a complete record behind another.
//
// An agent can cause decisions at thousands a second (a refused connection
// costs it a connect), so a log may have a size bound: past it, records
// are counted instead of written, by sandbox, uid, protocol, verdict,
// reason and rule, and Close writes one record per such group with Count
// set and the detail saying so. Refusals may take half the bound: a flood
// of them, which costs the agent nothing, leaves room for the lines of
// what it did reach. Nothing goes unaccounted, and the decisions metric
// counts every one as it happens.
type JSONLog struct {
	mu      sync.Mutex
	w       io.Writer
	err     error
	max     int64 // 0: no bound
	written int64
	denied  int64 // bytes of refusals written, at most max/2
	over    map[overKey]*gate.Record
	order   []overKey
	closed  bool
}

// overKey groups the records a full log counts.
type overKey struct {
	sandbox                      string
	uid                          uint32
	proto, verdict, reason, rule string
}

// NewJSONLog returns a recorder writing to w without a size bound. The
// caller owns w.
func NewJSONLog(w io.Writer) *JSONLog { return &JSONLog{w: w} }

// NewJSONLogLimit returns a recorder writing to w until max bytes are
// written (max > 0), then counting (see JSONLog). The caller owns w.
func NewJSONLogLimit(w io.Writer, max int64) *JSONLog {
	return &JSONLog{w: w, max: max, over: make(map[overKey]*gate.Record)}
}

// Record writes r, or counts it once the log is full. The first write
// error is kept (see Err) and later records are dropped: a broken log must
// be noticed, not half-written. So are records after Close.
func (l *JSONLog) Record(r gate.Record) {
	b, err := json.Marshal(r)
	if err != nil {
		return
	}
	b = append(b, '\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil || l.closed {
		return
	}
	refusal := r.Verdict != gate.VerdictAllow
	if l.max > 0 && (l.written+int64(len(b)) > l.max || refusal && l.denied+int64(len(b)) > l.max/2) {
		l.count(r)
		return
	}
	if refusal {
		l.denied += int64(len(b))
	}
	l.write(b)
}

func (l *JSONLog) write(b []byte) {
	n, err := l.w.Write(b)
	l.written += int64(n)
	if err != nil {
		l.err = err
	}
}

func (l *JSONLog) count(r gate.Record) {
	k := overKey{r.Sandbox, r.UID, r.Proto, r.Verdict, string(r.Reason), r.Rule}
	if c, ok := l.over[k]; ok {
		c.Count += r.Events()
		c.Time = r.Time
		return
	}
	c := gate.Record{Time: r.Time, Sandbox: r.Sandbox, UID: r.UID, Proto: r.Proto, Verdict: r.Verdict,
		Reason: r.Reason, Rule: r.Rule, Count: r.Events()}
	l.over[k] = &c
	l.order = append(l.order, k)
}

// Close writes what a full log counted, one record per group, and ends
// the log: later records are dropped. It does not close the writer.
func (l *JSONLog) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return l.err
	}
	l.closed = true
	for _, k := range l.order {
		c := *l.over[k]
		c.Detail = fmt.Sprintf("%d decisions not written one by one: the egress log reached its limit of %d bytes", c.Count, l.max)
		b, err := json.Marshal(c)
		if err != nil || l.err != nil {
			continue
		}
		l.write(append(b, '\n'))
	}
	l.over, l.order = nil, nil
	return l.err
}

// Err returns the first write error, if any.
func (l *JSONLog) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}
