package policyload

import (
	"encoding/json"
	"math"
	"reflect"
)

// difference is the first field where two configs disagree, with each
// side's value as text ("absent" when a side does not set it).
type difference struct {
	path string
	a, b string
}

// diffConfigs compares two parsed configs field by field, in schema order,
// and returns the first difference, or nil when they agree. Spellings do
// not count: [environment] in task.toml agrees with sandbox: in task.md.
func diffConfigs(a, b *Config) *difference {
	return diffValue(reflect.ValueOf(a).Elem(), reflect.ValueOf(b).Elem(), "")
}

func render(v reflect.Value) string {
	if !v.IsValid() || ((v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface) && v.IsNil()) {
		return "absent"
	}
	if v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	out, err := json.Marshal(v.Interface())
	if err != nil {
		return "?"
	}
	return string(out)
}

func diffValue(a, b reflect.Value, path string) *difference {
	differ := func() *difference { return &difference{path: path, a: render(a), b: render(b)} }
	if a.Kind() != b.Kind() {
		return differ()
	}
	switch a.Kind() {
	case reflect.Pointer, reflect.Interface:
		if a.IsNil() || b.IsNil() {
			if a.IsNil() != b.IsNil() {
				return differ()
			}
			return nil
		}
		return diffValue(a.Elem(), b.Elem(), path)
	case reflect.Struct:
		fields := fieldsOf(a.Type())
		if len(fields) == 0 {
			if !reflect.DeepEqual(a.Interface(), b.Interface()) {
				return differ()
			}
			return nil
		}
		for _, f := range fields {
			if d := diffValue(a.Field(f.index), b.Field(f.index), joinKey(path, f.name)); d != nil {
				return d
			}
		}
	case reflect.Slice:
		if a.IsNil() != b.IsNil() || a.Len() != b.Len() {
			return differ()
		}
		for i := 0; i < a.Len(); i++ {
			if d := diffValue(a.Index(i), b.Index(i), joinIndex(path, i)); d != nil {
				return d
			}
		}
	case reflect.Map:
		if a.IsNil() != b.IsNil() {
			return differ()
		}
		keys := map[string]bool{}
		for _, k := range a.MapKeys() {
			keys[k.String()] = true
		}
		for _, k := range b.MapKeys() {
			keys[k.String()] = true
		}
		for _, k := range sortedKeys(keys) {
			kv := reflect.ValueOf(k)
			if d := diffValue(a.MapIndex(kv), b.MapIndex(kv), joinKey(path, k)); d != nil {
				return d
			}
		}
	case reflect.Invalid:
		return nil
	case reflect.Float32, reflect.Float64:
		x, y := a.Float(), b.Float()
		if x != y && !(math.IsNaN(x) && math.IsNaN(y)) {
			return differ()
		}
	default:
		if !reflect.DeepEqual(a.Interface(), b.Interface()) {
			return differ()
		}
	}
	return nil
}
