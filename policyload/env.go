package policyload

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Env values in a task (sandbox.env, setup_commands[].env, verifier.env,
// oracle.env, steps[].verifier.env) may ask for a host variable:
//
//	${NAME}           the host's NAME
//	${NAME:-default}  the host's NAME, or default when it is unset or empty
//	$$                a literal "$", so "$${NAME}" is the text "${NAME}"
//
// A "$" before anything else is literal text, as in BenchFlow, which only
// substitutes the braced forms. NAME is letters, digits and underscores,
// not starting with a digit; any other text between "${" and "}" (other
// shell operators such as ":=" or "-" included) is an error rather than
// text passed through, so that a typo never reaches the sandbox as a
// literal. The loader only collects the names; the runner expands them
// with ExpandEnv, and only for the names given with --allow-task-env.

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// ValidEnvName reports whether s can name an environment variable.
func ValidEnvName(s string) bool { return envName.MatchString(s) }

// envRef is one ${...} in a value.
type envRef struct {
	name, def string
	hasDef    bool
}

// scanEnv walks a value, calling lit for literal text and ref for each
// reference, in order.
func scanEnv(s string, lit func(string), ref func(envRef) error) error {
	for {
		i := strings.IndexByte(s, '$')
		if i < 0 || i == len(s)-1 {
			lit(s)
			return nil
		}
		lit(s[:i])
		switch s[i+1] {
		case '$':
			lit("$")
			s = s[i+2:]
			continue
		case '{':
		default:
			lit("$")
			s = s[i+1:]
			continue
		}
		end := strings.IndexByte(s[i+2:], '}')
		if end < 0 {
			return fmt.Errorf("unterminated %q: a reference is ${NAME}; write $$ for a literal $", truncateRef(s[i:]))
		}
		inner := s[i+2 : i+2+end]
		r := envRef{name: inner}
		if n, d, ok := strings.Cut(inner, ":-"); ok {
			r = envRef{name: n, def: d, hasDef: true}
		}
		if !envName.MatchString(r.name) {
			return fmt.Errorf("invalid reference %q: a name is letters, digits and _, not starting with a digit (${NAME} or ${NAME:-default}); write $$ for a literal $",
				"${"+inner+"}")
		}
		if err := ref(r); err != nil {
			return err
		}
		s = s[i+2+end+1:]
	}
}

func truncateRef(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// EnvRefs returns the names of the host variables a value asks for, in
// order of appearance, repeats included.
func EnvRefs(value string) ([]string, error) {
	var names []string
	err := scanEnv(value, func(string) {}, func(r envRef) error {
		names = append(names, r.name)
		return nil
	})
	return names, err
}

// ErrEnvNotAllowed is returned by ExpandEnv, wrapped, for a reference to a
// variable that lookup does not provide and that has no default.
var ErrEnvNotAllowed = errors.New("host variable not allowed or not set")

// ExpandEnv substitutes a value's references with lookup, which returns a
// host variable's value and whether the task may have it (the runner's
// --allow-task-env list). "$$" becomes "$". A reference lookup does not
// provide uses its default, if it has one; otherwise ExpandEnv fails with
// ErrEnvNotAllowed naming it.
func ExpandEnv(value string, lookup func(name string) (string, bool)) (string, error) {
	var b strings.Builder
	err := scanEnv(value, func(s string) { b.WriteString(s) }, func(r envRef) error {
		v, ok := lookup(r.name)
		switch {
		case r.hasDef && (!ok || v == ""):
			b.WriteString(r.def)
		case ok:
			b.WriteString(v)
		default:
			return fmt.Errorf("${%s}: %w", r.name, ErrEnvNotAllowed)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	return b.String(), nil
}
