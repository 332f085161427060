package gateway

import (
	"encoding/json"
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
type JSONLog struct {
	mu  sync.Mutex
	w   io.Writer
	err error
}

// NewJSONLog returns a recorder writing to w. The caller owns w.
func NewJSONLog(w io.Writer) *JSONLog { return &JSONLog{w: w} }

// Record writes r. The first write error is kept (see Err) and later
// records are dropped: a broken log must be noticed, not half-written.
func (l *JSONLog) Record(r gate.Record) {
	b, err := json.Marshal(r)
	if err != nil {
		return
	}
	b = append(b, '\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return
	}
	if _, err := l.w.Write(b); err != nil {
		l.err = err
	}
}

// Err returns the first write error, if any.
func (l *JSONLog) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}
