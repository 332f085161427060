package gate

import (
	"strings"
	"sync"
	"testing"
	"time"
)

// collect is a Recorder keeping what it gets.
type collect struct {
	mu   sync.Mutex
	recs []Record
}

func (c *collect) Record(r Record) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.recs = append(c.recs, r)
}

func (c *collect) all() []Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Record(nil), c.recs...)
}

func limitRecord(detail string) Record {
	r := NewRecord(ProtoDNS, "", "", Deny(ReasonLimit))
	r.Detail = detail
	return r
}

// events sums what records stand for.
func events(recs []Record) int {
	n := 0
	for _, r := range recs {
		n += r.Events()
	}
	return n
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestThrottle(t *testing.T) {
	c := &collect{}
	th := NewThrottle(c, 100*time.Millisecond)
	defer th.Close()

	th.Record(limitRecord("udp: dropped"))
	if got := c.all(); len(got) != 1 || got[0].Count != 0 || got[0].Detail != "udp: dropped" {
		t.Fatalf("first of a burst: %+v, want it recorded at once as it is", got)
	}
	for range 99 {
		th.Record(limitRecord("udp: dropped"))
	}
	th.Record(limitRecord("tcp: closed")) // another kind: its own record, at once
	if got := c.all(); len(got) != 2 || got[1].Detail != "tcp: closed" {
		t.Fatalf("after the burst: %+v, want the first of each kind only", got)
	}
	waitFor(t, "the burst's summary", func() bool { return len(c.all()) == 3 })
	s := c.all()[2]
	if s.Count != 99 || s.Reason != ReasonLimit || s.Verdict != VerdictDeny || !strings.Contains(s.Detail, "udp: dropped (99 like it within 100ms") {
		t.Errorf("summary %+v, want count 99 with the detail saying so", s)
	}
	// A quiet interval ends the burst: the next one is recorded at once.
	time.Sleep(250 * time.Millisecond)
	n := len(c.all())
	th.Record(limitRecord("udp: dropped"))
	if got := c.all(); len(got) != n+1 || got[n].Count != 0 {
		t.Errorf("after a quiet interval: %+v, want the refusal recorded at once", got[n:])
	}
	if e := events(c.all()); e != 102 {
		t.Errorf("records stand for %d refusals, want 102", e)
	}
}

func TestThrottleCloseFlushes(t *testing.T) {
	c := &collect{}
	th := NewThrottle(c, time.Hour)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 500 {
				th.Record(limitRecord("flood"))
			}
		})
	}
	wg.Wait()
	if got := c.all(); len(got) != 1 {
		t.Fatalf("%d records before Close, want 1", len(got))
	}
	th.Close()
	got := c.all()
	if len(got) != 2 || got[1].Count != 3999 {
		t.Fatalf("after Close: %+v, want the pending 3999 as one record", got)
	}
	th.Record(limitRecord("flood")) // after Close: one by one
	if e := events(c.all()); e != 4001 {
		t.Errorf("records stand for %d refusals, want 4001", e)
	}
}
