// Package policyload reads what a task or an operator writes about the
// network: task folders (task.md with YAML front matter, or task.toml with
// instruction.md, with the [sandbox] section or its legacy [environment]
// spelling) and standalone flowgate policy files. It checks every field of
// BenchFlow's task schema (1.x), turns the network keys into a gate.Spec
// whose entries carry their full field paths, compiles it with gate.Compile,
// and checks a compiled policy against what a sandbox can enforce.
//
// Every error is a *gate.FieldError naming the file, the line where known,
// the field path, the bad value and, where it is obvious, the fix.
//
// policyload never touches the network, never resolves ${VAR} references
// (it only collects them; the runner resolves them under --allow-task-env),
// and never runs anything a task names. Host and URL entries are checked by
// gate.Compile alone, so that the loader, the gateway and `flowgate check`
// agree on what an entry means.
package policyload
