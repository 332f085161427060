package policyload

import (
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// decoder walks a node tree into the schema's Go types. It checks shape
// only: unknown keys, refused keys, both spellings of one key, wrong types.
// Values are checked afterwards by validate, which finds lines by path in
// lines.
type decoder struct {
	file  string
	lines map[string]int // field path as written -> line
}

// field is one key of a schema struct.
type field struct {
	index int
	name  string // the key
	alias string // its older spelling, or ""
}

var fieldCache sync.Map // reflect.Type -> []field

func fieldsOf(t reflect.Type) []field {
	if f, ok := fieldCache.Load(t); ok {
		return f.([]field)
	}
	var fs []field
	for i := 0; i < t.NumField(); i++ {
		tag, ok := t.Field(i).Tag.Lookup("key")
		if !ok {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		f := field{index: i, name: name}
		if a, ok := strings.CutPrefix(opts, "alias="); ok {
			f.alias = a
		}
		fs = append(fs, f)
	}
	fieldCache.Store(t, fs)
	return fs
}

var (
	versionType   = reflect.TypeFor[Version]()
	userType      = reflect.TypeFor[User]()
	artifactType  = reflect.TypeFor[Artifact]()
	taskInfoType  = reflect.TypeFor[TaskInfo]()
	minRewardType = reflect.TypeFor[MinReward]()
)

func (d *decoder) typeErr(n *node, path, want, fix string) error {
	value := ""
	if n.kind != kindMap && n.kind != kindList {
		value = n.text
	}
	return fieldErr(d.file, n.line, path, value, fmt.Sprintf("want %s, got %s", want, n.describe()), fix)
}

// decode fills v from n. Null is handled by the caller.
func (d *decoder) decode(n *node, path string, v reflect.Value) error {
	switch v.Type() {
	case versionType:
		switch n.kind {
		case kindString:
			v.SetString(n.text)
		case kindInt:
			v.SetString(strconv.FormatInt(n.i, 10))
		case kindFloat:
			v.SetString(formatFloat(n.f))
		default:
			return d.typeErr(n, path, `a version such as "1.4"`, "")
		}
		return nil
	case userType:
		switch n.kind {
		case kindString:
			v.SetString(n.text)
		case kindInt:
			v.SetString(strconv.FormatInt(n.i, 10))
		default:
			return d.typeErr(n, path, "a user name or a numeric uid", "")
		}
		return nil
	case artifactType, taskInfoType:
		if n.kind == kindString {
			v.Field(0).SetString(n.text) // Source, Name
			return nil
		}
	case minRewardType:
		return d.minReward(n, path, v.Addr().Interface().(*MinReward))
	}
	switch v.Kind() {
	case reflect.Pointer:
		e := reflect.New(v.Type().Elem())
		if err := d.decode(n, path, e.Elem()); err != nil {
			return err
		}
		v.Set(e)
	case reflect.Struct:
		return d.decodeStruct(n, path, v)
	case reflect.Slice:
		if n.kind != kindList {
			return d.typeErr(n, path, "a list", "write [ ... ]")
		}
		s := reflect.MakeSlice(v.Type(), len(n.items), len(n.items))
		for i, it := range n.items {
			ip := joinIndex(path, i)
			d.lines[ip] = it.line
			if err := d.decode(it, ip, s.Index(i)); err != nil {
				return err
			}
		}
		v.Set(s)
	case reflect.Map:
		if n.kind != kindMap {
			return d.typeErr(n, path, "a table", "")
		}
		m := reflect.MakeMapWithSize(v.Type(), len(n.pairs))
		for _, p := range n.pairs {
			kp := joinKey(path, p.key)
			d.lines[kp] = p.line
			e := reflect.New(v.Type().Elem()).Elem()
			if err := d.decode(p.val, kp, e); err != nil {
				return err
			}
			m.SetMapIndex(reflect.ValueOf(p.key), e)
		}
		v.Set(m)
	case reflect.String:
		if n.kind != kindString {
			fix := ""
			if n.kind != kindMap && n.kind != kindList && n.kind != kindNull {
				fix = "quote it: " + strconv.Quote(n.text)
			}
			return d.typeErr(n, path, "a string", fix)
		}
		v.SetString(n.text)
	case reflect.Int:
		if n.kind != kindInt {
			return d.typeErr(n, path, "an integer", "")
		}
		v.SetInt(n.i)
	case reflect.Float64:
		f, err := d.number(n, path)
		if err != nil {
			return err
		}
		v.SetFloat(f)
	case reflect.Bool:
		if n.kind != kindBool {
			return d.typeErr(n, path, "true or false", "")
		}
		v.SetBool(n.b)
	case reflect.Interface:
		if x := freeForm(n); x != nil {
			v.Set(reflect.ValueOf(x))
		}
	default:
		return fmt.Errorf("decoding %s: unsupported schema type %s", path, v.Type())
	}
	return nil
}

func (d *decoder) number(n *node, path string) (float64, error) {
	var f float64
	switch n.kind {
	case kindInt:
		f = float64(n.i)
	case kindFloat:
		f = n.f
	default:
		return 0, d.typeErr(n, path, "a number", "")
	}
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return 0, fieldErr(d.file, n.line, path, n.text, "want a finite number", "")
	}
	return f, nil
}

func (d *decoder) minReward(n *node, path string, m *MinReward) error {
	if n.kind == kindInt || n.kind == kindFloat {
		f, err := d.number(n, path)
		m.Value = &f
		return err
	}
	if n.kind != kindMap {
		return d.typeErr(n, path, "a number or a table of numbers", "")
	}
	m.Keys = make(map[string]float64, len(n.pairs))
	for _, p := range n.pairs {
		kp := joinKey(path, p.key)
		d.lines[kp] = p.line
		f, err := d.number(p.val, kp)
		if err != nil {
			return err
		}
		m.Keys[p.key] = f
	}
	return nil
}

func (d *decoder) decodeStruct(n *node, path string, v reflect.Value) error {
	if n.kind != kindMap {
		return d.typeErr(n, path, "a table", "")
	}
	fields := fieldsOf(v.Type())
	refused := refusedKeys(v.Type().Name())
	byKey := make(map[string]field, 2*len(fields))
	for _, f := range fields {
		byKey[f.name] = f
		if f.alias != "" {
			byKey[f.alias] = f
		}
	}
	written := make(map[int]bool, len(n.pairs))
	for _, p := range n.pairs {
		kp := joinKey(path, p.key)
		if r, ok := refused[p.key]; ok {
			return fieldErr(d.file, p.line, kp, "", r.msg, r.fix)
		}
		f, ok := byKey[p.key]
		if !ok {
			return fieldErr(d.file, p.line, kp, "", "unknown key", unknownKeyFix(p.key, v.Type(), fields))
		}
		if _, dup := written[f.index]; dup {
			return fieldErr(d.file, p.line, kp, "", fmt.Sprintf("both %s and %s are set; %s is the older spelling of %s",
				joinKey(path, f.name), joinKey(path, f.alias), f.alias, f.name), "keep only "+f.name)
		}
		written[f.index] = true
		if p.val.kind == kindNull {
			continue // "key:" with no value reads as absent
		}
		d.lines[kp] = p.line
		if err := d.decode(p.val, kp, v.Field(f.index)); err != nil {
			return err
		}
	}
	return nil
}

// unknownKeyFix suggests the key meant, or lists the valid ones.
func unknownKeyFix(key string, t reflect.Type, fields []field) string {
	norm := strings.ToLower(strings.ReplaceAll(key, "-", "_"))
	for _, f := range fields {
		if norm == f.name {
			return fmt.Sprintf("did you mean %q?", f.name)
		}
	}
	if t == reflect.TypeFor[Config]() {
		for _, f := range fieldsOf(reflect.TypeFor[Sandbox]()) {
			if norm == f.name || norm == f.alias {
				return fmt.Sprintf("%s belongs in the sandbox section", f.name)
			}
		}
	}
	names := make([]string, 0, len(fields))
	for _, f := range fields {
		names = append(names, f.name)
	}
	return "valid keys: " + strings.Join(names, ", ")
}

// freeForm converts a node to plain Go values for metadata and reward:
// map[string]any, []any, string, int64, float64, bool, nil.
func freeForm(n *node) any {
	switch n.kind {
	case kindMap:
		m := make(map[string]any, len(n.pairs))
		for _, p := range n.pairs {
			m[p.key] = freeForm(p.val)
		}
		return m
	case kindList:
		l := make([]any, len(n.items))
		for i, it := range n.items {
			l[i] = freeForm(it)
		}
		return l
	case kindString, kindTime:
		return n.text
	case kindInt:
		return n.i
	case kindFloat:
		return n.f
	case kindBool:
		return n.b
	}
	return nil
}

// lineOf finds the line of a field path, or of its nearest parent.
func (d *decoder) lineOf(path string) int {
	for path != "" {
		if l, ok := d.lines[path]; ok {
			return l
		}
		i := strings.LastIndexAny(path, ".[")
		if i <= 0 {
			break
		}
		path = path[:i]
	}
	return d.lines[path]
}

// sortedKeys returns a map's keys in order, for deterministic walks.
func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
