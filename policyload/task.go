package policyload

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"unicode"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"flowgate/gate"
)

// MaxFileSize bounds every file the loader reads: room for a policy of a
// few hundred thousand rules, not for a file that would exhaust memory.
const MaxFileSize = 32 << 20

// The files of a task folder.
const (
	TaskMD        = "task.md"
	TaskTOML      = "task.toml"
	InstructionMD = "instruction.md"
)

// Task is a loaded, checked task folder.
type Task struct {
	// Dir is the folder as given.
	Dir string
	// Name is task.name ("org/name"), or the folder's name when the task
	// does not set one.
	Name string
	// Prompt is what the agent is asked: task.md after its front matter, or
	// instruction.md. It may be empty only for a multi-step task.
	Prompt string
	// Config is the whole task file as parsed. When a folder holds both
	// task.md and task.toml, they agree, and this is task.md's.
	Config Config
	// Spec is the agent phase's policy as written: agent overrides over the
	// sandbox's section, each entry with its field path.
	Spec gate.Spec
	// Policy is Spec compiled: what the gateway enforces while the agent
	// works.
	Policy *gate.Policy
	// EnvRefs are the host variables the task's env sections ask for
	// (${NAME}), sorted and unique; nil when none. They are not resolved.
	EnvRefs []string
}

// LoadTask reads and checks a task folder: task.md (YAML front matter, then
// the prompt), or task.toml with instruction.md, or both, which must then
// agree field by field.
func LoadTask(dir string) (*Task, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("loading task: %w", err)
	}
	if !st.IsDir() {
		return nil, fieldErr(dir, 0, "", "", "not a directory", "give the task's folder, the one holding task.md or task.toml")
	}
	mdPath, tomlPath := filepath.Join(dir, TaskMD), filepath.Join(dir, TaskTOML)
	mdData, hasMD, err := readTaskFile(mdPath)
	if err != nil {
		return nil, err
	}
	tomlData, hasTOML, err := readTaskFile(tomlPath)
	if err != nil {
		return nil, err
	}
	if !hasMD && !hasTOML {
		return nil, fieldErr(dir, 0, "", "", "no task.md or task.toml",
			"a task folder holds task.md (YAML front matter, then the prompt), or task.toml with instruction.md")
	}
	var md, tm *parsed
	var mdPrompt string
	var mdChecked, tmChecked *checked
	if hasMD {
		if md, mdPrompt, err = parseMD(mdPath, mdData); err != nil {
			return nil, err
		}
		if mdChecked, err = md.validate(); err != nil {
			return nil, err
		}
	}
	var instr string
	if hasTOML {
		if tm, err = parseTOMLFile(tomlPath, tomlData); err != nil {
			return nil, err
		}
		if tmChecked, err = tm.validate(); err != nil {
			return nil, err
		}
		data, ok, err := readTaskFile(filepath.Join(dir, InstructionMD))
		if err != nil {
			return nil, err
		}
		instr = string(data)
		if !ok && !hasMD && len(tm.cfg.Steps) == 0 {
			return nil, fieldErr(filepath.Join(dir, InstructionMD), 0, "", "", "missing: task.toml needs instruction.md beside it for the prompt",
				"write the prompt to instruction.md, or use task.md")
		}
	}
	p, c, prompt := md, mdChecked, mdPrompt
	if !hasMD {
		p, c, prompt = tm, tmChecked, instr
	} else if hasTOML {
		if d := diffConfigs(&md.cfg, &tm.cfg); d != nil {
			f := tm.written(d.path)
			return nil, fieldErr(tomlPath, tm.d.lineOf(f), f, "",
				fmt.Sprintf("task.md and task.toml disagree: task.md has %s, task.toml has %s", d.a, d.b),
				"keep one of the two files, or make them agree")
		}
		if instr != "" && strings.TrimSpace(instr) != strings.TrimSpace(mdPrompt) {
			return nil, fieldErr(filepath.Join(dir, InstructionMD), 0, "", "", "differs from the prompt in task.md",
				"keep one of the two, or make them agree")
		}
	}
	if strings.TrimSpace(prompt) == "" && len(p.cfg.Steps) == 0 {
		return nil, fieldErr(p.file, 0, "", "", "the task has no prompt", "write what the agent is asked after the front matter, or in instruction.md")
	}
	t := &Task{Dir: dir, Prompt: prompt, Config: p.cfg, Spec: c.spec, Policy: c.policy, EnvRefs: c.envRefs}
	t.Name = filepath.Base(filepath.Clean(dir))
	if abs, err := filepath.Abs(dir); err == nil {
		t.Name = filepath.Base(abs)
	}
	if p.cfg.Task != nil {
		t.Name = p.cfg.Task.Name
	} else if strings.IndexFunc(t.Name, func(r rune) bool {
		return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == utf8.RuneError
	}) >= 0 {
		// The name goes to terminals and logs as it is.
		return nil, fieldErr(p.file, 0, "task.name", "", fmt.Sprintf("missing, and the folder's name %q holds control or format characters", t.Name),
			"set task.name, or rename the folder")
	}
	return t, nil
}

// written maps a field path in canonical spelling ("sandbox.env.X") to the
// spelling this file used ("environment.env.X"), to find its line.
func (p *parsed) written(field string) string {
	for _, a := range []struct{ name, alias string }{
		{"sandbox", "environment"}, {"oracle", "solution"}, {"schema_version", "version"},
	} {
		if rest, ok := strings.CutPrefix(field, a.name); ok && (rest == "" || rest[0] == '.' || rest[0] == '[') && p.present(a.alias) {
			field = a.alias + rest
		}
	}
	return field
}

// readTaskFile reads a regular file of at most MaxFileSize bytes; a missing
// file is not an error. It opens without blocking, so that a FIFO planted
// in a task folder is refused instead of hanging the loader. A symlink is
// followed only to a file inside the task folder: bench reads the task as
// root and passes its prompt into the sandbox, so a task whose
// instruction.md links to /proc/self/environ or a file in root's home
// would carry host secrets in.
func readTaskFile(path string) ([]byte, bool, error) { return readFile(path, true) }

// readFile is readTaskFile; inFolder false follows a symlink anywhere (a
// policy file the operator names, through a link of theirs).
func readFile(path string, inFolder bool) ([]byte, bool, error) {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("reading %s: %w", path, err)
	}
	open := path
	if fi.Mode()&fs.ModeSymlink != 0 && !inFolder {
		if open, err = filepath.EvalSymlinks(path); err != nil {
			return nil, false, fieldErr(path, 0, "", "", "a symlink that does not resolve: "+err.Error(), "")
		}
	} else if fi.Mode()&fs.ModeSymlink != 0 {
		real, err := filepath.EvalSymlinks(path)
		if err != nil {
			return nil, false, fieldErr(path, 0, "", "", "a symlink that does not resolve: "+err.Error(), "")
		}
		dir, err := filepath.EvalSymlinks(filepath.Dir(path))
		if err != nil {
			return nil, false, fmt.Errorf("reading %s: %w", path, err)
		}
		if !strings.HasPrefix(real, dir+string(filepath.Separator)) {
			return nil, false, fieldErr(path, 0, "", "", fmt.Sprintf("a symlink out of the task folder (to %s)", real),
				"copy the file into the task folder")
		}
		open = real
	}
	f, err := os.OpenFile(open, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, false, fmt.Errorf("reading %s: %w", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, false, fmt.Errorf("reading %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return nil, false, fieldErr(path, 0, "", "", "not a regular file", "")
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, false, fmt.Errorf("reading %s: %w", path, err)
	}
	if len(data) > MaxFileSize {
		return nil, false, fieldErr(path, 0, "", "", fmt.Sprintf("larger than %d bytes", MaxFileSize), "")
	}
	return data, true, nil
}

// splitFrontMatter separates task.md's YAML front matter, between a first
// line "---" and the next line "---", from the prompt after it.
func splitFrontMatter(file string, data []byte) (front, prompt []byte, err error) {
	data = bytes.TrimPrefix(data, []byte("\xef\xbb\xbf"))
	first, rest, _ := bytes.Cut(data, []byte("\n"))
	if !isFence(first) {
		return nil, nil, fieldErr(file, 1, "", "", "no front matter: task.md must start with a line holding only ---",
			"put the task's settings between two --- lines at the top (an empty block is ---, then ---), then the prompt")
	}
	for off := 0; off <= len(rest); {
		line, _, _ := bytes.Cut(rest[off:], []byte("\n"))
		if isFence(line) {
			end := off + len(line)
			if end < len(rest) {
				end++ // the newline
			}
			return rest[:off], rest[end:], nil
		}
		off += len(line) + 1
	}
	return nil, nil, fieldErr(file, 1, "", "", "front matter is not closed", "end it with a line holding only ---")
}

func isFence(line []byte) bool {
	return string(bytes.TrimRight(line, " \t\r")) == "---"
}

// parseMD reads task.md.
func parseMD(file string, data []byte) (*parsed, string, error) {
	front, prompt, err := splitFrontMatter(file, data)
	if err != nil {
		return nil, "", err
	}
	root, err := parseYAML(file, front, 1)
	if err != nil {
		return nil, "", err
	}
	p, err := decodeConfig(file, root)
	if err != nil {
		return nil, "", err
	}
	return p, string(prompt), nil
}

// parseYAML parses one YAML document into a tree; lineOffset is the line
// the document starts after.
func parseYAML(file string, data []byte, lineOffset int) (*node, error) {
	if err := checkEntries(file, data); err != nil {
		return nil, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return &node{kind: kindNull, line: lineOffset + 1}, nil
		}
		return nil, yamlSyntaxError(file, err, lineOffset)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if err != nil {
			return nil, yamlSyntaxError(file, err, lineOffset)
		}
		return nil, fieldErr(file, extra.Line+lineOffset, "", "", "more than one YAML document", "keep one")
	}
	return fromYAML(file, &doc, lineOffset)
}

func parseTOMLFile(file string, data []byte) (*parsed, error) {
	root, err := parseTOML(file, data)
	if err != nil {
		return nil, err
	}
	return decodeConfig(file, root)
}

// decodeConfig walks a tree into a Config.
func decodeConfig(file string, root *node) (*parsed, error) {
	p := &parsed{file: file, d: &decoder{file: file, lines: make(map[string]int)}}
	if root.kind == kindNull {
		return p, nil
	}
	if err := p.d.decodeStruct(root, "", reflect.ValueOf(&p.cfg).Elem()); err != nil {
		return nil, err
	}
	return p, nil
}
