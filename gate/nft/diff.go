package nft

import (
	"fmt"
	"strings"
)

// DiffKind says how the live table differs from the expected one.
type DiffKind string

// The kinds of difference.
const (
	Missing DiffKind = "missing" // expected but not in the live table
	Extra   DiffKind = "extra"   // in the live table but not expected
	Changed DiffKind = "changed" // in both, different: a rule with the same comment, a set or chain declaration, the table's flags
)

// Difference is one way the live table differs from the expected one.
type Difference struct {
	Kind DiffKind
	// Where names the table, a chain ("chain agent") or a set ("set
	// block4").
	Where string
	// Want is the expected text (empty for Extra); Got the live text
	// (empty for Missing). Rules read as `nft list` prints them, with
	// counters at zero.
	Want string
	Got  string
}

// String is one line: "missing in chain agent: RULE", "extra in set
// block4: element 10.0.0.0/8", "changed in chain agent: want RULE; got
// RULE", or "moved in chain agent: RULE" for a rule found at another
// position.
func (d Difference) String() string {
	switch {
	case d.Kind == Missing:
		return fmt.Sprintf("missing in %s: %s", d.Where, oneLine(d.Want))
	case d.Kind == Extra:
		return fmt.Sprintf("extra in %s: %s", d.Where, oneLine(d.Got))
	case d.Want == d.Got:
		return fmt.Sprintf("moved in %s: %s", d.Where, oneLine(d.Want))
	}
	return fmt.Sprintf("changed in %s: want %s; got %s", d.Where, oneLine(d.Want), oneLine(d.Got))
}

// oneLine folds a multi-line block (a whole set or chain) into one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " ")), " ")
}

const tableWhere = "table inet " + TableName

// Diff lists how live differs from expected: missing, extra and changed
// rules, chains and sets, and a changed table. Counter values, handles and
// the elements of the learned sets (run-time state) are not compared; the
// order of chains and sets is not either, the order of rules in a chain is.
// live may be nil, which reads as a missing table. No differences means
// the live table enforces what expected says.
func Diff(expected, live *Ruleset) []Difference {
	switch {
	case !expected.Exists() && !live.Exists():
		return nil
	case !live.Exists():
		return []Difference{{Kind: Missing, Where: tableWhere, Want: tableWhere}}
	case !expected.Exists():
		return []Difference{{Kind: Extra, Where: tableWhere, Got: tableWhere}}
	}
	var out []Difference
	if expected.flags != live.flags {
		out = append(out, Difference{Kind: Changed, Where: tableWhere,
			Want: "flags " + orNone(tableFlagsText(expected.flags)), Got: "flags " + orNone(tableFlagsText(live.flags))})
	}
	for _, s := range expected.sets {
		out = append(out, diffSet(s, live.set(s.name))...)
	}
	for _, s := range live.sets {
		if expected.set(s.name) == nil {
			out = append(out, Difference{Kind: Extra, Where: "set " + nameText(s.name), Got: s.text()})
		}
	}
	for _, c := range expected.chains {
		out = append(out, diffChain(expected, live, c, live.chain(c.name))...)
	}
	for _, c := range live.chains {
		if expected.chain(c.name) == nil {
			out = append(out, Difference{Kind: Extra, Where: "chain " + nameText(c.name), Got: live.chainText(c, false)})
		}
	}
	return out
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func diffSet(want, got *set) []Difference {
	where := "set " + nameText(want.name)
	if got == nil {
		return []Difference{{Kind: Missing, Where: where, Want: want.text()}}
	}
	var out []Difference
	if w, g := want.declText(), got.declText(); w != g {
		out = append(out, Difference{Kind: Changed, Where: where, Want: w, Got: g})
	}
	if want.learned {
		return out
	}
	have := make(map[string]bool, len(got.elems))
	for _, e := range got.elems {
		have[elementText(e)] = true
	}
	wanted := make(map[string]bool, len(want.elems))
	for _, e := range want.elems {
		t := elementText(e)
		wanted[t] = true
		if !have[t] {
			out = append(out, Difference{Kind: Missing, Where: where, Want: "element " + t})
		}
	}
	for _, e := range got.elems {
		if t := elementText(e); !wanted[t] {
			out = append(out, Difference{Kind: Extra, Where: where, Got: "element " + t})
		}
	}
	return out
}

func diffChain(expected, live *Ruleset, want, got *chain) []Difference {
	where := "chain " + nameText(want.name)
	if got == nil {
		return []Difference{{Kind: Missing, Where: where, Want: expected.chainText(want, false)}}
	}
	var out []Difference
	header := func(c *chain) string {
		if c.hook == nil {
			return "regular chain"
		}
		return c.hook.text()
	}
	if w, g := header(want), header(got); w != g {
		out = append(out, Difference{Kind: Changed, Where: where, Want: w, Got: g})
	}
	wt := make([]string, len(want.rules))
	for i, ru := range want.rules {
		wt[i] = expected.ruleText(ru, false)
	}
	gt := make([]string, len(got.rules))
	for i, ru := range got.rules {
		gt[i] = live.ruleText(ru, false)
	}
	inW, inG := lcs(wt, gt)
	// Rules left over on both sides with the same comment are one rule,
	// changed or moved.
	byComment := make(map[string][]int)
	for j, ru := range got.rules {
		if !inG[j] && ru.comment != "" {
			byComment[ru.comment] = append(byComment[ru.comment], j)
		}
	}
	paired := make(map[int]bool)
	for i, ru := range want.rules {
		if inW[i] {
			continue
		}
		if js := byComment[ru.comment]; len(js) > 0 {
			byComment[ru.comment] = js[1:]
			paired[js[0]] = true
			out = append(out, Difference{Kind: Changed, Where: where, Want: wt[i], Got: gt[js[0]]})
			continue
		}
		out = append(out, Difference{Kind: Missing, Where: where, Want: wt[i]})
	}
	for j := range got.rules {
		if !inG[j] && !paired[j] {
			out = append(out, Difference{Kind: Extra, Where: where, Got: gt[j]})
		}
	}
	return out
}

// lcs marks the entries of a and b that belong to a longest common
// subsequence.
func lcs(a, b []string) (inA, inB []bool) {
	n, m := len(a), len(b)
	t := make([][]int, n+1)
	for i := range t {
		t[i] = make([]int, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if a[i] == b[j] {
				t[i][j] = t[i+1][j+1] + 1
			} else {
				t[i][j] = max(t[i+1][j], t[i][j+1])
			}
		}
	}
	inA, inB = make([]bool, n), make([]bool, m)
	for i, j := 0, 0; i < n && j < m; {
		switch {
		case a[i] == b[j]:
			inA[i], inB[j] = true, true
			i++
			j++
		case t[i+1][j] >= t[i][j+1]:
			i++
		default:
			j++
		}
	}
	return inA, inB
}
