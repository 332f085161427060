package policyload

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	toml "github.com/pelletier/go-toml/v2"
	"github.com/pelletier/go-toml/v2/unstable"
	"go.yaml.in/yaml/v3"

	"flowgate/gate"
)

// Both formats are first turned into one small tree of nodes with their
// lines, so that one schema walker checks both the same way: the same keys,
// the same types, the same error texts.

type kind uint8

const (
	kindNull kind = iota
	kindMap
	kindList
	kindString
	kindInt
	kindFloat
	kindBool
	kindTime // a date or a time, kept as text
)

var kindNames = [...]string{kindNull: "null", kindMap: "a table", kindList: "a list", kindString: "a string",
	kindInt: "an integer", kindFloat: "a number", kindBool: "a boolean", kindTime: "a date"}

type node struct {
	kind  kind
	line  int
	text  string // a string's value; any scalar's text, for errors
	i     int64
	f     float64
	b     bool
	pairs []pair  // kindMap, in document order
	items []*node // kindList
}

type pair struct {
	key  string
	line int
	val  *node
}

// describe names what a node is, for "want X, got Y" errors.
func (n *node) describe() string { return kindNames[n.kind] }

// bareKey matches keys written without quotes in a field path.
var bareKey = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

func joinKey(path, key string) string {
	if !bareKey.MatchString(key) {
		key = "[" + strconv.Quote(key) + "]"
		return path + key
	}
	if path == "" {
		return key
	}
	return path + "." + key
}

func joinIndex(path string, i int) string { return path + "[" + strconv.Itoa(i) + "]" }

// fieldErr builds the one error type the package returns.
func fieldErr(file string, line int, field, value, msg, fix string) *gate.FieldError {
	return &gate.FieldError{File: file, Line: line, Field: field, Value: value, Msg: msg, Fix: fix}
}

// fromYAML converts a parsed YAML document. lineOffset is added to every
// line (the front matter starts on line 2 of task.md). Anchors and aliases
// are refused: task files have no use for them, and they are how a small
// file becomes a large document.
func fromYAML(file string, y *yaml.Node, lineOffset int) (*node, error) {
	c := yamlConv{file: file, off: lineOffset}
	if y.Kind == yaml.DocumentNode {
		if len(y.Content) == 0 {
			return &node{kind: kindNull, line: y.Line + lineOffset}, nil
		}
		y = y.Content[0]
	}
	return c.conv(y, nil, 0)
}

// fieldPath is a value's place in a document, built into text
// ("sandbox.env.X", "steps[2]") only when an error names it: building
// every value's path up front costs path length × values.
type fieldPath struct {
	parent *fieldPath
	name   string
	i      int
	isItem bool
}

func (p *fieldPath) key(k string) *fieldPath { return &fieldPath{parent: p, name: k} }
func (p *fieldPath) index(i int) *fieldPath  { return &fieldPath{parent: p, i: i, isItem: true} }

// String is the path as errors name it; "" for the document itself.
func (p *fieldPath) String() string {
	if p == nil {
		return ""
	}
	if p.isItem {
		return joinIndex(p.parent.String(), p.i)
	}
	return joinKey(p.parent.String(), p.name)
}

// MaxDepth bounds how deeply a task file's tables and lists nest. Task files
// need a handful of levels; the bound keeps the work per byte small.
const MaxDepth = 32

// MaxKeyLen bounds a key's length: every value below a key carries its
// path in errors, so a long key over a long list costs key × list.
const MaxKeyLen = 1024

// MaxEntries bounds the separators (commas, line ends, opening brackets
// and braces) of a YAML or TOML document, which bound its values: the
// parsers take a few hundred bytes of memory per value, so a 16 MB file of
// one-letter list items would take gigabytes. A policy of 100,000 rules
// has about 100,000.
const MaxEntries = 1 << 20

// checkEntries refuses a document with more than MaxEntries separators,
// before it is parsed.
func checkEntries(file string, data []byte) error {
	n := 0
	for _, c := range data {
		switch c {
		case ',', '\n', '[', '{':
			n++
		}
	}
	if n > MaxEntries {
		return fieldErr(file, 0, "", "", fmt.Sprintf("more than %d entries (lines, list items, tables)", MaxEntries),
			"split the file, or write fewer, wider rules")
	}
	return nil
}

func keyLenErr(file string, line int, path string, key string) error {
	return fieldErr(file, line, path, "", fmt.Sprintf("a key of %d bytes, longer than %d", len(key), MaxKeyLen), "")
}

func depthErr(file string, line int, path string) error {
	return fieldErr(file, line, path, "", fmt.Sprintf("nested deeper than %d levels", MaxDepth), "")
}

type yamlConv struct {
	file string
	off  int
}

func (c yamlConv) conv(y *yaml.Node, at *fieldPath, depth int) (*node, error) {
	line := y.Line + c.off
	if depth > MaxDepth {
		return nil, depthErr(c.file, line, at.String())
	}
	if y.Kind == yaml.AliasNode || y.Anchor != "" {
		return nil, fieldErr(c.file, line, at.String(), "", "YAML anchors and aliases are not accepted", "write the value out in full")
	}
	switch y.Kind {
	case yaml.MappingNode:
		n := &node{kind: kindMap, line: line}
		seen := make(map[string]int, len(y.Content)/2)
		for i := 0; i+1 < len(y.Content); i += 2 {
			k, v := y.Content[i], y.Content[i+1]
			kl := k.Line + c.off
			if k.Kind == yaml.AliasNode || k.Anchor != "" {
				return nil, fieldErr(c.file, kl, at.String(), "", "YAML anchors and aliases are not accepted", "write the value out in full")
			}
			if k.Kind != yaml.ScalarNode || k.ShortTag() == "!!null" {
				return nil, fieldErr(c.file, kl, at.String(), "", "a key must be a plain name", "")
			}
			if k.ShortTag() == "!!merge" {
				return nil, fieldErr(c.file, kl, at.String(), "<<", "YAML merge keys are not accepted", "write the keys out in full")
			}
			if len(k.Value) > MaxKeyLen {
				return nil, keyLenErr(c.file, kl, at.String(), k.Value)
			}
			kp := at.key(k.Value)
			if first, dup := seen[k.Value]; dup {
				return nil, fieldErr(c.file, kl, kp.String(), "", fmt.Sprintf("duplicate key (first set on line %d)", first), "keep one")
			}
			seen[k.Value] = kl
			val, err := c.conv(v, kp, depth+1)
			if err != nil {
				return nil, err
			}
			n.pairs = append(n.pairs, pair{key: k.Value, line: kl, val: val})
		}
		return n, nil
	case yaml.SequenceNode:
		n := &node{kind: kindList, line: line}
		for i, it := range y.Content {
			val, err := c.conv(it, at.index(i), depth+1)
			if err != nil {
				return nil, err
			}
			n.items = append(n.items, val)
		}
		return n, nil
	case yaml.ScalarNode:
		return c.scalar(y, at, line)
	}
	return nil, fieldErr(c.file, line, at.String(), "", "unsupported YAML node", "")
}

func (c yamlConv) scalar(y *yaml.Node, at *fieldPath, line int) (*node, error) {
	n := &node{line: line, text: y.Value}
	var err error
	switch y.ShortTag() {
	case "!!str":
		n.kind = kindString
	case "!!null":
		n.kind = kindNull
	case "!!bool":
		n.kind = kindBool
		err = y.Decode(&n.b)
	case "!!int":
		n.kind = kindInt
		err = y.Decode(&n.i)
	case "!!float":
		n.kind = kindFloat
		err = y.Decode(&n.f)
	case "!!timestamp":
		n.kind = kindTime
	default:
		return nil, fieldErr(c.file, line, at.String(), y.Value, fmt.Sprintf("YAML tag %s is not accepted", y.ShortTag()), "remove the tag")
	}
	if err != nil {
		return nil, fieldErr(c.file, line, at.String(), y.Value, "not a valid "+strings.TrimPrefix(n.describe(), "a "), "")
	}
	return n, nil
}

// yamlLineErr matches the position yaml.v3 puts in its syntax errors.
var yamlLineErr = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// yamlSyntaxError turns a yaml.v3 parse error into a FieldError at the
// right line of the file.
func yamlSyntaxError(file string, err error, lineOffset int) error {
	msg := err.Error()
	if m := yamlLineErr.FindStringSubmatch(msg); m != nil {
		n, _ := strconv.Atoi(m[1])
		return fieldErr(file, n+lineOffset, "", "", "invalid YAML: "+m[2], "")
	}
	return fieldErr(file, 0, "", "", "invalid YAML: "+strings.TrimPrefix(msg, "yaml: "), "")
}

// parseTOML decodes a TOML document with go-toml (which enforces TOML's own
// rules: no duplicate keys, no redefined tables) and converts it to a tree,
// with lines taken from go-toml's parser.
func parseTOML(file string, data []byte) (*node, error) {
	if err := checkEntries(file, data); err != nil {
		return nil, err
	}
	var m map[string]any
	if err := toml.Unmarshal(data, &m); err != nil {
		var de *toml.DecodeError
		if errors.As(err, &de) {
			line, _ := de.Position()
			// de.Key() is relative to the table being read, so the line
			// locates the error, not a field path.
			return nil, fieldErr(file, line, "", "", "invalid TOML: "+strings.TrimPrefix(de.Error(), "toml: "), "")
		}
		return nil, fieldErr(file, 0, "", "", "invalid TOML: "+strings.TrimPrefix(err.Error(), "toml: "), "")
	}
	if deep, long := tomlShape(m, 0); deep {
		return nil, depthErr(file, 0, "")
	} else if long != "" {
		return nil, keyLenErr(file, 0, "", long)
	}
	lines := tomlLines(data)
	return fromTOML(m, "", lines, 1)
}

// tomlShape reports whether a decoded TOML value nests deeper than
// MaxDepth, or else a key longer than MaxKeyLen. It runs before anything
// builds field paths, whose cost grows with depth and key length.
func tomlShape(v any, depth int) (deep bool, longKey string) {
	if depth > MaxDepth {
		return true, ""
	}
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if len(k) > MaxKeyLen {
				return false, k
			}
			if deep, long := tomlShape(x, depth+1); deep || long != "" {
				return deep, long
			}
		}
	case []any:
		for _, x := range v {
			if deep, long := tomlShape(x, depth+1); deep || long != "" {
				return deep, long
			}
		}
	}
	return false, ""
}

func fromTOML(v any, path string, lines map[string]int, parentLine int) (*node, error) {
	line := lines[path]
	if line == 0 {
		line = parentLine
	}
	n := &node{line: line}
	switch v := v.(type) {
	case map[string]any:
		n.kind = kindMap
		for k, val := range v {
			kp := joinKey(path, k)
			child, err := fromTOML(val, kp, lines, line)
			if err != nil {
				return nil, err
			}
			kl := lines[kp]
			if kl == 0 {
				kl = line
			}
			n.pairs = append(n.pairs, pair{key: k, line: kl, val: child})
		}
		sort.Slice(n.pairs, func(i, j int) bool {
			a, b := n.pairs[i], n.pairs[j]
			if a.line != b.line {
				return a.line < b.line
			}
			return a.key < b.key
		})
	case []any:
		n.kind = kindList
		for i, it := range v {
			child, err := fromTOML(it, joinIndex(path, i), lines, line)
			if err != nil {
				return nil, err
			}
			n.items = append(n.items, child)
		}
	case string:
		n.kind, n.text = kindString, v
	case bool:
		n.kind, n.b, n.text = kindBool, v, strconv.FormatBool(v)
	case int64:
		n.kind, n.i, n.text = kindInt, v, strconv.FormatInt(v, 10)
	case float64:
		n.kind, n.f, n.text = kindFloat, v, formatFloat(v)
	case time.Time:
		n.kind, n.text = kindTime, v.Format(time.RFC3339Nano)
	case toml.LocalDate:
		n.kind, n.text = kindTime, v.String()
	case toml.LocalTime:
		n.kind, n.text = kindTime, v.String()
	case toml.LocalDateTime:
		n.kind, n.text = kindTime, v.String()
	default:
		return nil, fmt.Errorf("converting TOML value at %s: unexpected %T", path, v)
	}
	return n, nil
}

// formatFloat prints a number in its shortest form, the same for YAML and
// TOML, so that 1.0 in either file reads "1".
func formatFloat(f float64) string {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return strconv.FormatFloat(f, 'g', -1, 64)
	}
	return strconv.FormatFloat(f, 'f', -1, 64)
}

// tomlLines maps each key path of a TOML document ("environment.env.HOME",
// "steps[1].agent.timeout_sec") to the line it is written on. It runs after
// a successful toml.Unmarshal, so the document is known to be valid.
func tomlLines(data []byte) map[string]int {
	lines := make(map[string]int)
	counts := make(map[string]int) // array-of-tables path -> elements so far
	var p unstable.Parser
	p.Reset(data)
	lineAt := func(n *unstable.Node) int {
		if n == nil || n.Raw.Length == 0 {
			return 0
		}
		return p.Shape(n.Raw).Start.Line
	}
	record := func(path string, line int) {
		if _, ok := lines[path]; !ok && line > 0 {
			lines[path] = line
		}
	}
	var keyValue func(base string, kv *unstable.Node)
	var value func(path string, v *unstable.Node, line int)
	value = func(path string, v *unstable.Node, line int) {
		switch v.Kind {
		case unstable.InlineTable:
			it := v.Children()
			for it.Next() {
				keyValue(path, it.Node())
			}
		case unstable.Array:
			it := v.Children()
			for i := 0; it.Next(); i++ {
				ip := joinIndex(path, i)
				l := lineAt(it.Node())
				if l == 0 {
					l = line
				}
				record(ip, l)
				value(ip, it.Node(), l)
			}
		}
	}
	keyValue = func(base string, kv *unstable.Node) {
		path, line := base, 0
		it := kv.Key()
		for it.Next() {
			path = joinKey(path, string(it.Node().Data))
			line = lineAt(it.Node())
			record(path, line)
		}
		value(path, kv.Value(), line)
	}
	table := ""
	for p.NextExpression() {
		e := p.Expression()
		switch e.Kind {
		case unstable.Table, unstable.ArrayTable:
			path := ""
			it := e.Key()
			for it.Next() {
				path = joinKey(path, string(it.Node().Data))
				line := lineAt(it.Node())
				record(path, line)
				if it.IsLast() && e.Kind == unstable.ArrayTable {
					n := counts[path]
					counts[path] = n + 1
					path = joinIndex(path, n)
					record(path, line)
				} else if n, ok := counts[path]; ok {
					path = joinIndex(path, n-1)
				}
			}
			table = path
		case unstable.KeyValue:
			keyValue(table, e)
		}
	}
	return lines
}
