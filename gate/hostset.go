package gate

import "strings"

// HostSet matches canonical names against host rules. A rule "example.com"
// matches example.com and every name under it, never badexample.com; a rule
// "*.example.com" matches only names under example.com, at any depth; a
// service rule (a single label from allowed_hosts) matches that name alone.
//
// A lookup costs one map probe per label of the queried name and allocates
// nothing, whatever the number of rules.
type HostSet struct {
	apex     map[string]*Rule // name and its subdomains
	wildcard map[string]*Rule // subdomains only, keyed by the parent
	exact    map[string]*Rule // this name only
}

// NewHostSet returns an empty set sized for n rules.
func NewHostSet(n int) *HostSet {
	return &HostSet{apex: make(map[string]*Rule, n)}
}

// Len is the number of rules in the set.
func (s *HostSet) Len() int {
	if s == nil {
		return 0
	}
	return len(s.apex) + len(s.wildcard) + len(s.exact)
}

// addApex adds a rule for name and its subdomains. The first rule for a key
// wins, so the one reported is the first one written.
func (s *HostSet) addApex(name string, r *Rule) {
	if _, ok := s.apex[name]; !ok {
		s.apex[name] = r
	}
}

func (s *HostSet) addWildcard(parent string, r *Rule) {
	if s.wildcard == nil {
		s.wildcard = make(map[string]*Rule)
	}
	if _, ok := s.wildcard[parent]; !ok {
		s.wildcard[parent] = r
	}
}

func (s *HostSet) addExact(name string, r *Rule) {
	if s.exact == nil {
		s.exact = make(map[string]*Rule)
	}
	if _, ok := s.exact[name]; !ok {
		s.exact[name] = r
	}
}

// Match returns the most specific rule matching the canonical name, or nil.
// name must come from CanonicalHost; Match does not canonicalise.
func (s *HostSet) Match(name string) *Rule {
	if s == nil || name == "" {
		return nil
	}
	if r := s.exact[name]; r != nil {
		return r
	}
	if r := s.apex[name]; r != nil {
		return r
	}
	for rest := name; ; {
		i := strings.IndexByte(rest, '.')
		if i < 0 {
			return nil
		}
		rest = rest[i+1:]
		if r := s.apex[rest]; r != nil {
			return r
		}
		if r := s.wildcard[rest]; r != nil {
			return r
		}
	}
}
