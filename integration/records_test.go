package integration

// The gateway's decision records as the tests collect and compare them.

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"flowgate/gate"
	"flowgate/gate/nstest"
)

// recorder collects the gateway's decision records.
type recorder struct {
	mu   sync.Mutex
	recs []gate.Record
}

// Record implements gate.Recorder.
func (r *recorder) Record(rec gate.Record) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec)
}

// mark is where the next record will go.
func (r *recorder) mark() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.recs)
}

// since returns the records from mark on.
func (r *recorder) since(mark int) []gate.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.recs[mark:])
}

// rec is the part of a record the tests compare: everything but the time
// and the free-form detail. Sandbox and uid are checked for every record.
type rec struct {
	Proto, Dest, Name, Path, Verdict string
	Reason                           gate.Reason
	Rule                             string
}

func (r rec) String() string {
	return fmt.Sprintf("%s %s %s dest=%q name=%q path=%q rule=%q", r.Verdict, r.Reason, r.Proto, r.Dest, r.Name, r.Path, r.Rule)
}

// deny and allow build expected records.
func deny(proto, dest, name string, reason gate.Reason, rule string) rec {
	return rec{Proto: proto, Dest: dest, Name: name, Verdict: gate.VerdictDeny, Reason: reason, Rule: rule}
}

func allow(proto, dest, name string, reason gate.Reason, rule string) rec {
	return rec{Proto: proto, Dest: dest, Name: name, Verdict: gate.VerdictAllow, Reason: reason, Rule: rule}
}

// distinct reduces records to their distinct recs, sorted, checking that
// each names this sandbox and the agent's uid.
func distinct(t testing.TB, recs []gate.Record, verdict string) []rec {
	t.Helper()
	seen := make(map[rec]bool)
	var out []rec
	for _, r := range recs {
		if r.Sandbox != sandboxTag || r.UID != nstest.AgentUID {
			t.Errorf("record for sandbox %q uid %d, want %q uid %d: %+v", r.Sandbox, r.UID, sandboxTag, nstest.AgentUID, r)
		}
		if r.Verdict != verdict {
			continue
		}
		k := rec{Proto: r.Proto, Dest: r.Dest, Name: r.Name, Path: r.Path, Verdict: r.Verdict, Reason: r.Reason, Rule: r.Rule}
		if !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	slices.SortFunc(out, func(a, b rec) int { return strings.Compare(a.String(), b.String()) })
	return out
}

// wantDenials checks that the denials recorded since mark are exactly
// want (each at least once, nothing else). A Dest or Rule of "*" in want
// stands for any. A record may be written just after the client has its
// answer (DNS), so a missing one is waited for a little.
func (s *sandbox) wantDenials(t testing.TB, mark int, want ...rec) {
	t.Helper()
	cmp := func(a, b rec) int { return strings.Compare(a.String(), b.String()) }
	w := slices.Clone(want)
	slices.SortFunc(w, cmp)
	w = slices.Compact(w)
	var got []rec
	settle(func() bool {
		got = distinct(t, s.log.since(mark), gate.VerdictDeny)
		for i, g := range got {
			for _, x := range want {
				if matches(x, g) {
					got[i] = x
					break
				}
			}
		}
		slices.SortFunc(got, cmp)
		got = slices.Compact(got)
		return slices.Equal(got, w)
	})
	if !slices.Equal(got, w) {
		t.Errorf("denials recorded:\n\t%s\nwant:\n\t%s", joinRecs(got), joinRecs(w))
	}
}

// wantAllowed checks that each of want was recorded since mark. A Dest or
// Rule of "*" in want stands for any.
func (s *sandbox) wantAllowed(t testing.TB, mark int, want ...rec) {
	t.Helper()
	var got []rec
	missing := func(w rec) bool { return !slices.ContainsFunc(got, func(g rec) bool { return matches(w, g) }) }
	settle(func() bool {
		got = distinct(t, s.log.since(mark), gate.VerdictAllow)
		return !slices.ContainsFunc(want, missing)
	})
	for _, w := range want {
		if missing(w) {
			t.Errorf("missing allow record %s; allowed:\n\t%s", w, joinRecs(got))
		}
	}
}

// settle calls ok until it reports true, for at most two seconds.
func settle(ok func() bool) {
	deadline := time.Now().Add(2 * time.Second)
	for !ok() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
}

// matches reports whether got is what want describes, "*" standing for
// any Dest or Rule.
func matches(want, got rec) bool {
	if want.Dest == "*" {
		got.Dest = "*"
	}
	if want.Rule == "*" {
		got.Rule = "*"
	}
	return got == want
}

func joinRecs(rs []rec) string {
	if len(rs) == 0 {
		return "(none)"
	}
	var ss []string
	for _, r := range rs {
		ss = append(ss, r.String())
	}
	return strings.Join(ss, "\n\t")
}
