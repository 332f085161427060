package policyload

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestEnvRefs(t *testing.T) {
	tests := []struct {
		in   string
		refs []string
		err  string
	}{
		{"plain", nil, ""},
		{"${A}", []string{"A"}, ""},
		{"x${A}y${_B1}z${A}", []string{"A", "_B1", "A"}, ""},
		{"${A:-default value}", []string{"A"}, ""},
		{"${A:-}", []string{"A"}, ""},
		{"$${A}", nil, ""},            // escaped: the text ${A}
		{"$$${A}", []string{"A"}, ""}, // "$" then ${A}
		{"$A and $ and trailing $", nil, ""},
		{"cost: 5$", nil, ""},
		{"${1A}", nil, "invalid reference"},
		{"${A-B}", nil, "invalid reference"},
		{"${A:=b}", nil, "invalid reference"},
		{"${}", nil, "invalid reference"},
		{"${A", nil, "unterminated"},
		{"x ${A} ${", nil, "unterminated"},
	}
	for _, tt := range tests {
		refs, err := EnvRefs(tt.in)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("EnvRefs(%q) error %v, want %q", tt.in, err, tt.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(refs, tt.refs) {
			t.Errorf("EnvRefs(%q) = %q, %v; want %q", tt.in, refs, err, tt.refs)
		}
	}
}

func TestExpandEnv(t *testing.T) {
	allowed := map[string]string{"A": "alpha", "EMPTY": ""}
	lookup := func(n string) (string, bool) { v, ok := allowed[n]; return v, ok }
	tests := []struct{ in, out string }{
		{"${A}", "alpha"},
		{"x-${A}-y", "x-alpha-y"},
		{"$${A}", "${A}"},
		{"$$", "$"},
		{"$A", "$A"},
		{"${B:-fallback}", "fallback"},
		{"${EMPTY:-fallback}", "fallback"},
		{"${A:-fallback}", "alpha"},
		{"${EMPTY}", ""},
	}
	for _, tt := range tests {
		got, err := ExpandEnv(tt.in, lookup)
		if err != nil || got != tt.out {
			t.Errorf("ExpandEnv(%q) = %q, %v; want %q", tt.in, got, err, tt.out)
		}
	}
	_, err := ExpandEnv("key=${SECRET}", lookup)
	if !errors.Is(err, ErrEnvNotAllowed) || !strings.Contains(err.Error(), "${SECRET}") {
		t.Errorf("not allowed: %v", err)
	}
}
