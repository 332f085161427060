package policyload

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"flowgate/gate"
)

// TestLoadTaskErrors has one case per validation error: each asserts the
// file, the line, the field path, the bad value, the message and, where the
// fix is obvious, the fix. task.md front matter starts on line 2.
func TestLoadTaskErrors(t *testing.T) {
	tests := []struct {
		name  string
		files map[string]string
		want  wantErr
	}{
		// The files themselves.
		{"no front matter", map[string]string{"task.md": "sandbox:\n  network_mode: public\n"},
			wantErr{file: "task.md", line: 1, msg: "no front matter", fix: "between two --- lines"}},
		{"front matter not closed", map[string]string{"task.md": "---\nsandbox: {}\n"},
			wantErr{file: "task.md", line: 1, msg: "not closed", fix: "line holding only ---"}},
		{"yaml syntax", map[string]string{"task.md": md("sandbox:\n  network_mode: public\n bad: 1\n")},
			wantErr{file: "task.md", line: 3, msg: "invalid YAML: did not find expected key"}},
		{"yaml anchor", map[string]string{"task.md": md("metadata: &m {a: 1}\nreward: *m\n")},
			wantErr{file: "task.md", line: 2, field: "metadata", msg: "anchors and aliases are not accepted", fix: "write the value out"}},
		{"yaml merge key", map[string]string{"task.md": md("sandbox:\n  <<: {cpus: 1}\n")},
			wantErr{file: "task.md", line: 3, field: "sandbox", value: "<<", msg: "merge keys"}},
		{"yaml custom tag", map[string]string{"task.md": md("sandbox:\n  network_mode: !mode public\n")},
			wantErr{file: "task.md", line: 3, field: "sandbox.network_mode", value: "public", msg: "tag !mode", fix: "remove the tag"}},
		{"front matter not a table", map[string]string{"task.md": md("- a\n- b\n")},
			wantErr{file: "task.md", line: 2, msg: "want a table, got a list"}},
		{"yaml duplicate key", map[string]string{"task.md": md("sandbox:\n  cpus: 1\n  cpus: 2\n")},
			wantErr{file: "task.md", line: 4, field: "sandbox.cpus", msg: "duplicate key (first set on line 3)", fix: "keep one"}},
		{"toml duplicate key", map[string]string{"task.toml": "[sandbox]\ncpus = 1\ncpus = 2\n", "instruction.md": "x"},
			wantErr{file: "task.toml", line: 3, msg: "invalid TOML: key cpus is already defined"}},
		{"toml syntax", map[string]string{"task.toml": "[sandbox]\nnetwork_mode = \n", "instruction.md": "x"},
			wantErr{file: "task.toml", line: 2, msg: "invalid TOML"}},
		{"toml without instruction.md", map[string]string{"task.toml": "[sandbox]\n"},
			wantErr{file: "instruction.md", msg: "needs instruction.md", fix: "write the prompt to instruction.md"}},
		{"empty prompt", map[string]string{"task.md": "---\nsandbox: {}\n---\n\n"},
			wantErr{file: "task.md", msg: "no prompt", fix: "after the front matter"}},
		{"no task file", map[string]string{"README": "x"},
			wantErr{file: "my-task", msg: "no task.md or task.toml", fix: "task.toml with instruction.md"}},
		{"yaml nested too deeply", map[string]string{"task.md": md("metadata: " + strings.Repeat("[", 40) + strings.Repeat("]", 40) + "\n")},
			wantErr{file: "task.md", line: 2, field: "metadata" + strings.Repeat("[0]", 32), msg: "nested deeper than 32 levels"}},
		{"toml nested too deeply", map[string]string{"task.toml": "metadata = " + strings.Repeat("[", 40) + strings.Repeat("]", 40) + "\n", "instruction.md": "x"},
			wantErr{file: "task.toml", msg: "nested deeper than 32 levels"}},
		{"file too large", map[string]string{"task.md": md("metadata:\n  a: \"" + strings.Repeat("x", MaxFileSize) + "\"\n")},
			wantErr{file: "task.md", msg: fmt.Sprintf("larger than %d bytes", MaxFileSize)}},

		// Keys.
		{"unknown key", map[string]string{"task.md": md("sandbox: {}\nsandboxes: {}\n")},
			wantErr{file: "task.md", line: 3, field: "sandboxes", msg: "unknown key", fix: "valid keys: schema_version, task, metadata"}},
		{"unknown key in sandbox", map[string]string{"task.md": md("sandbox:\n  blocked_host: [a.com]\n")},
			wantErr{file: "task.md", line: 3, field: "sandbox.blocked_host", msg: "unknown key", fix: "blocked_hosts"}},
		{"misspelt key", map[string]string{"task.md": md("sandbox:\n  Network-Mode: public\n")},
			wantErr{file: "task.md", line: 3, field: "sandbox.Network-Mode", msg: "unknown key", fix: `did you mean "network_mode"?`}},
		{"sandbox key at top level", map[string]string{"task.md": md("network_mode: no-network\n")},
			wantErr{file: "task.md", line: 2, field: "network_mode", msg: "unknown key", fix: "belongs in the sandbox section"}},
		{"both sandbox and environment", map[string]string{"task.toml": "[sandbox]\ncpus = 1\n[environment]\ncpus = 1\n", "instruction.md": "x"},
			wantErr{file: "task.toml", line: 3, field: "environment", msg: "both sandbox and environment are set; environment is the older spelling of sandbox", fix: "keep only sandbox"}},
		{"both schema_version and version", map[string]string{"task.md": md("version: \"1.0\"\nschema_version: \"1.4\"\n")},
			wantErr{file: "task.md", line: 3, field: "schema_version", msg: "version is the older spelling of schema_version", fix: "keep only schema_version"}},
		{"both image and docker_image", map[string]string{"task.md": md("sandbox:\n  docker_image: a\n  image: b\n")},
			wantErr{file: "task.md", line: 4, field: "sandbox.image", msg: "both sandbox.docker_image and sandbox.image are set; image is the older spelling of docker_image", fix: "keep only docker_image"}},
		{"both oracle and solution", map[string]string{"task.toml": "[solution]\nenv = {}\n[oracle]\nenv = {}\n", "instruction.md": "x"},
			wantErr{file: "task.toml", line: 3, field: "oracle", msg: "solution is the older spelling of oracle", fix: "keep only oracle"}},

		// Types.
		{"int wanted", map[string]string{"task.md": md("sandbox:\n  cpus: two\n")},
			wantErr{file: "task.md", line: 3, field: "sandbox.cpus", value: "two", msg: "want an integer, got a string"}},
		{"string wanted", map[string]string{"task.md": md("sandbox:\n  env:\n    PORT: 8080\n")},
			wantErr{file: "task.md", line: 4, field: "sandbox.env.PORT", value: "8080", msg: "want a string, got an integer", fix: `quote it: "8080"`}},
		{"list wanted", map[string]string{"task.md": md("sandbox:\n  network_mode: denylist\n  blocked_hosts: example.com\n")},
			wantErr{file: "task.md", line: 4, field: "sandbox.blocked_hosts", value: "example.com", msg: "want a list", fix: "write [ ... ]"}},
		{"table wanted", map[string]string{"task.toml": "sandbox = \"public\"\n", "instruction.md": "x"},
			wantErr{file: "task.toml", line: 1, field: "sandbox", value: "public", msg: "want a table, got a string"}},
		{"bool wanted", map[string]string{"task.md": md("sandbox:\n  allow_internet: \"no\"\n")},
			wantErr{file: "task.md", line: 3, field: "sandbox.allow_internet", value: "no", msg: "want true or false"}},
		{"finite number wanted", map[string]string{"task.md": md("agent:\n  timeout_sec: .inf\n")},
			wantErr{file: "task.md", line: 3, field: "agent.timeout_sec", value: ".inf", msg: "want a finite number"}},
		{"min_reward type", map[string]string{"task.md": md("steps:\n  - name: a\n    min_reward: high\n")},
			wantErr{file: "task.md", line: 4, field: "steps[0].min_reward", value: "high", msg: "want a number or a table of numbers"}},
		{"user type", map[string]string{"task.md": md("agent:\n  user: [a]\n")},
			wantErr{file: "task.md", line: 3, field: "agent.user", msg: "want a user name or a numeric uid"}},

		// Values.
		{"schema version 2", map[string]string{"task.md": md("schema_version: \"2.0\"\n")},
			wantErr{file: "task.md", line: 2, field: "schema_version", value: "2.0", msg: "schema version 2 is not supported; bench reads schema 1.x"}},
		{"schema version garbage", map[string]string{"task.toml": "version = \"one\"\n", "instruction.md": "x"},
			wantErr{file: "task.toml", line: 1, field: "version", value: "one", msg: "not a schema version", fix: `"1.4"`}},
		{"task name", map[string]string{"task.md": md("task:\n  name: half life\n")},
			wantErr{file: "task.md", line: 3, field: "task.name", value: "half life", msg: "org/name", fix: "physics/half-life"}},
		{"task name as string", map[string]string{"task.md": md("task: ../x\n")},
			wantErr{file: "task.md", line: 2, field: "task", value: "../x", msg: "org/name"}},
		{"author without name", map[string]string{"task.md": md("task:\n  name: a/b\n  authors:\n    - email: a@example.com\n")},
			wantErr{file: "task.md", line: 5, field: "task.authors[0].name", msg: "needs a name"}},
		{"artifact not absolute", map[string]string{"task.md": md("artifacts: [answer.txt]\n")},
			wantErr{file: "task.md", line: 2, field: "artifacts[0]", value: "answer.txt", msg: "absolute path", fix: "/app/answer.txt"}},
		{"artifact escapes trial folder", map[string]string{"task.md": md("artifacts:\n  - source: /app\n    destination: ../../etc\n")},
			wantErr{file: "task.md", line: 4, field: "artifacts[0].destination", value: "../../etc", msg: "inside the trial folder", fix: "relative path"}},
		{"negative timeout", map[string]string{"task.md": md("verifier:\n  timeout_sec: -1\n")},
			wantErr{file: "task.md", line: 3, field: "verifier.timeout_sec", value: "-1", msg: "must not be negative"}},
		{"negative memory", map[string]string{"task.toml": "[environment]\nmemory_mb = -5\n", "instruction.md": "x"},
			wantErr{file: "task.toml", line: 2, field: "environment.memory_mb", value: "-5", msg: "must not be negative"}},
		{"empty image", map[string]string{"task.md": md("sandbox:\n  image: \"\"\n")},
			wantErr{file: "task.md", line: 3, field: "sandbox.image", msg: "empty image name", fix: "name an image"}},
		{"os not linux", map[string]string{"task.md": md("sandbox:\n  os: windows\n")},
			wantErr{file: "task.md", line: 3, field: "sandbox.os", value: "windows", msg: "not supported: bench runs Linux sandboxes only", fix: `"linux"`}},
		{"workdir relative", map[string]string{"task.md": md("sandbox:\n  workdir: app\n")},
			wantErr{file: "task.md", line: 3, field: "sandbox.workdir", value: "app", msg: "absolute path", fix: "/app"}},
		{"setup command missing", map[string]string{"task.md": md("sandbox:\n  setup_commands:\n    - timeout_sec: 5\n")},
			wantErr{file: "task.md", line: 4, field: "sandbox.setup_commands[0].command", msg: "needs a command"}},
		{"setup cwd relative", map[string]string{"task.toml": "[[environment.setup_commands]]\ncommand = \"make\"\ncwd = \"src\"\n", "instruction.md": "x"},
			wantErr{file: "task.toml", line: 3, field: "environment.setup_commands[0].cwd", value: "src", msg: "absolute path"}},
		{"env bad name", map[string]string{"task.md": md("sandbox:\n  env:\n    1X: a\n")},
			wantErr{file: "task.md", line: 4, field: "sandbox.env.1X", msg: "not a valid variable name"}},
		{"env bad reference", map[string]string{"task.md": md("verifier:\n  env:\n    A: ${1X}\n")},
			wantErr{file: "task.md", line: 4, field: "verifier.env.A", value: "${1X}", msg: "invalid reference", fix: ""}},
		{"env unterminated reference", map[string]string{"task.md": md("oracle:\n  env:\n    A: ${HOME\n")},
			wantErr{file: "task.md", line: 4, field: "oracle.env.A", value: "${HOME", msg: "unterminated"}},
		{"env bad reference in setup command", map[string]string{"task.toml": "[[sandbox.setup_commands]]\ncommand = \"x\"\nenv = { A = \"${A:=b}\" }\n", "instruction.md": "x"},
			wantErr{file: "task.toml", line: 3, field: "sandbox.setup_commands[0].env.A", value: "${A:=b}", msg: "invalid reference"}},
		{"user name", map[string]string{"task.md": md("verifier:\n  user: \"bad user\"\n")},
			wantErr{file: "task.md", line: 3, field: "verifier.user", value: "bad user", msg: "not a valid user name"}},
		{"reward range", map[string]string{"task.md": md("verifier:\n  reward_range: [1, 0]\n")},
			wantErr{file: "task.md", line: 3, field: "verifier.reward_range", msg: "min < max", fix: "[0, 1]"}},
		{"strategy", map[string]string{"task.md": md("multi_step_reward_strategy: best\n")},
			wantErr{file: "task.md", line: 2, field: "multi_step_reward_strategy", value: "best", msg: "valid: mean, final"}},
		{"step without name", map[string]string{"task.md": md("steps:\n  - min_reward: 1\n")},
			wantErr{file: "task.md", line: 3, field: "steps[0].name", msg: "a step needs a name"}},
		{"step name duplicate", map[string]string{"task.md": md("steps:\n  - name: a\n  - name: a\n")},
			wantErr{file: "task.md", line: 4, field: "steps[1].name", value: "a", msg: "duplicate step name (also steps[0])"}},
		{"healthcheck without command", map[string]string{"task.toml": "[[steps]]\nname = \"a\"\n[steps.healthcheck]\nretries = 1\n", "instruction.md": "x"},
			wantErr{file: "task.toml", line: 3, field: "steps[0].healthcheck.command", msg: "needs a command"}},

		// Fields that would change enforcement and are not supported.
		{"agent as root", map[string]string{"task.md": md("agent:\n  user: root\n")},
			wantErr{file: "task.md", line: 3, field: "agent.user", value: "root", msg: "not supported: the agent must run as an unprivileged user", fix: "non-root"}},
		{"agent as uid 0", map[string]string{"task.md": md("agent:\n  user: 0\n")},
			wantErr{file: "task.md", line: 3, field: "agent.user", value: "0", msg: "not supported"}},
		{"verifier network policy", map[string]string{"task.md": md("verifier:\n  network_mode: no-network\n")},
			wantErr{file: "task.md", line: 3, field: "verifier.network_mode", msg: "not supported: the verifier runs as root after the agent stops and is never filtered", fix: "remove it"}},
		{"verifier allowed hosts", map[string]string{"task.toml": "[verifier]\nallowed_hosts = [\"a.com\"]\n", "instruction.md": "x"},
			wantErr{file: "task.toml", line: 2, field: "verifier.allowed_hosts", msg: "not supported"}},
		{"step network mode", map[string]string{"task.md": md("steps:\n  - name: a\n    network_mode: no-network\n")},
			wantErr{file: "task.md", line: 4, field: "steps[0].network_mode", msg: "not supported: per-step network policies", fix: "sandbox or agent"}},
		{"step sandbox", map[string]string{"task.toml": "[[steps]]\nname = \"a\"\n[steps.environment]\nallow_internet = false\n", "instruction.md": "x"},
			wantErr{file: "task.toml", line: 3, field: "steps[0].environment", msg: "not supported: per-step network policies"}},
		{"step agent blocked urls", map[string]string{"task.md": md("steps:\n  - name: a\n    agent:\n      blocked_urls: [https://a.com/x]\n")},
			wantErr{file: "task.md", line: 5, field: "steps[0].agent.blocked_urls", msg: "not supported: per-step network policies", fix: "set the policy in agent"}},
		{"step verifier network", map[string]string{"task.md": md("steps:\n  - name: a\n    verifier:\n      blocked_hosts: [a.com]\n")},
			wantErr{file: "task.md", line: 5, field: "steps[0].verifier.blocked_hosts", msg: "the verifier runs as root"}},

		// Network modes.
		{"unknown mode", map[string]string{"task.md": md("schema_version: \"1.4\"\nsandbox:\n  network_mode: deny\n")},
			wantErr{file: "task.md", line: 4, field: "sandbox.network_mode", value: "deny", msg: `unknown network_mode "deny"; valid: public, no-network, denylist, allowlist`}},
		{"mode hint", map[string]string{"task.md": md("sandbox:\n  network_mode: whitelist\n")},
			wantErr{file: "task.md", line: 3, field: "sandbox.network_mode", value: "whitelist", msg: `did you mean "allowlist"?`}},
		{"empty mode", map[string]string{"task.md": md("sandbox:\n  network_mode: \"\"\n")},
			wantErr{file: "task.md", line: 3, field: "sandbox.network_mode", msg: "empty network_mode", fix: "public"}},
		{"agent mode", map[string]string{"task.md": md("agent:\n  network_mode: offline\n")},
			wantErr{file: "task.md", line: 3, field: "agent.network_mode", value: "offline", msg: `did you mean "no-network"?`}},
		{"allow_internet false beside denylist", map[string]string{"task.md": md("sandbox:\n  network_mode: denylist\n  allow_internet: false\n")},
			wantErr{file: "task.md", line: 4, field: "sandbox.allow_internet", value: "false", msg: "contradicts network_mode denylist", fix: "remove allow_internet"}},
		{"allow_internet true beside no-network", map[string]string{"task.toml": "[environment]\nallow_internet = true\nnetwork_mode = \"no-network\"\n", "instruction.md": "x"},
			wantErr{file: "task.toml", line: 2, field: "environment.allow_internet", value: "true", msg: "contradicts network_mode no-network"}},

		// Lists against modes, and entries (checked by gate.Compile).
		{"blocked_hosts in public", map[string]string{"task.md": md("sandbox:\n  blocked_hosts: [a.com]\n")},
			wantErr{file: "task.md", line: 3, field: "sandbox.blocked_hosts", msg: "blocked_hosts applies only to network_mode denylist, not public", fix: "set sandbox.network_mode: denylist"}},
		{"allowed_hosts in denylist", map[string]string{"task.md": md("sandbox:\n  network_mode: denylist\n  allowed_hosts: [a.com]\n")},
			wantErr{file: "task.md", line: 4, field: "sandbox.allowed_hosts", msg: "allowed_hosts applies only to network_mode allowlist", fix: "set sandbox.network_mode: allowlist"}},
		{"blocked_urls in allowlist, legacy spelling", map[string]string{"task.toml": "[environment]\nnetwork_mode = \"allowlist\"\nblocked_urls = [\"https://a.com/x\"]\n", "instruction.md": "x"},
			wantErr{file: "task.toml", line: 3, field: "environment.blocked_urls", msg: "blocked_urls applies only to network_mode denylist", fix: "set environment.network_mode: denylist"}},
		{"agent list against sandbox mode", map[string]string{"task.md": md("sandbox:\n  network_mode: public\nagent:\n  allowed_hosts: [a.com]\n")},
			wantErr{file: "task.md", line: 5, field: "agent.allowed_hosts", msg: "applies only to network_mode allowlist, not public", fix: "set sandbox.network_mode: allowlist"}},
		{"URL as host", map[string]string{"task.md": md("sandbox:\n  network_mode: denylist\n  blocked_hosts:\n    - a.com\n    - https://b.com/x\n")},
			wantErr{file: "task.md", line: 6, field: "sandbox.blocked_hosts[1]", value: "https://b.com/x", msg: "a URL is not a host entry", fix: "put the URL in blocked_urls"}},
		{"bad wildcard", map[string]string{"task.md": md("sandbox:\n  network_mode: allowlist\n  allowed_hosts: [\"*.com\"]\n")},
			wantErr{file: "task.md", line: 4, field: "sandbox.allowed_hosts[0]", value: "*.com", msg: "at least two labels", fix: "*.example.com"}},
		{"service name in denylist", map[string]string{"task.md": md("sandbox:\n  network_mode: denylist\n  blocked_hosts: [db]\n")},
			wantErr{file: "task.md", line: 4, field: "sandbox.blocked_hosts[0]", value: "db", msg: "service name", fix: "full host name"}},
		{"host with port", map[string]string{"task.md": md("agent:\n  network_mode: allowlist\n  allowed_hosts: [\"a.com:443\"]\n")},
			wantErr{file: "task.md", line: 4, field: "agent.allowed_hosts[0]", value: "a.com:443", msg: "match every port", fix: "remove the port"}},
		{"CIDR with host bits", map[string]string{"task.toml": "[sandbox]\nnetwork_mode = \"allowlist\"\nallowed_hosts = [\n  \"a.com\",\n  \"10.1.2.3/8\",\n]\n", "instruction.md": "x"},
			wantErr{file: "task.toml", line: 5, field: "sandbox.allowed_hosts[1]", value: "10.1.2.3/8", msg: "host bits set", fix: "write 10.0.0.0/8"}},
		{"bad host name", map[string]string{"task.md": md("sandbox:\n  network_mode: denylist\n  blocked_hosts: [\"bad_host.com\"]\n")},
			wantErr{file: "task.md", line: 4, field: "sandbox.blocked_hosts[0]", value: "bad_host.com", msg: "not a valid host name"}},
		{"relative URL", map[string]string{"task.md": md("sandbox:\n  network_mode: denylist\n  blocked_urls: [example.org/papers]\n")},
			wantErr{file: "task.md", line: 4, field: "sandbox.blocked_urls[0]", value: "example.org/papers", msg: "not an absolute URL", fix: "https://example.org/papers"}},
		{"ftp URL", map[string]string{"task.md": md("sandbox:\n  network_mode: denylist\n  blocked_urls: [\"ftp://a.com/x\"]\n")},
			wantErr{file: "task.md", line: 4, field: "sandbox.blocked_urls[0]", value: "ftp://a.com/x", msg: `scheme "ftp" is not http or https`}},
		{"URL with query", map[string]string{"task.md": md("sandbox:\n  network_mode: denylist\n  blocked_urls: [\"https://a.com/x?id=1\"]\n")},
			wantErr{file: "task.md", line: 4, field: "sandbox.blocked_urls[0]", value: "https://a.com/x?id=1", msg: "not a query", fix: "remove the ?query"}},
		{"bad sandbox entry under an agent override", map[string]string{"task.md": md("sandbox:\n  network_mode: denylist\n  blocked_hosts: [\"*\"]\nagent:\n  network_mode: public\n")},
			wantErr{file: "task.md", line: 4, field: "sandbox.blocked_hosts[0]", value: "*", msg: "wildcard"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, ok := tt.files["task.md"]; !ok {
				if _, ok := tt.files["task.toml"]; !ok && tt.want.file != "my-task" {
					t.Fatal("case has no task file")
				}
			}
			_, err := LoadTask(writeTask(t, tt.files))
			checkFieldErr(t, err, tt.want)
		})
	}
}

// A FIFO or a directory named like a task file is refused, not read: a
// FIFO would block the loader forever.
func TestLoadTaskNotRegular(t *testing.T) {
	dir := writeTask(t, map[string]string{"instruction.md": "x"})
	if err := syscall.Mkfifo(filepath.Join(dir, "task.md"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := LoadTask(dir)
	checkFieldErr(t, err, wantErr{file: "task.md", msg: "not a regular file"})

	dir = writeTask(t, map[string]string{"task.toml/x": "", "instruction.md": "x"})
	_, err = LoadTask(dir)
	checkFieldErr(t, err, wantErr{file: "task.toml", msg: "not a regular file"})
}

// A task file that links out of the task folder is refused: bench reads
// the task as root and passes its prompt into the sandbox. A link inside
// the folder is followed.
func TestLoadTaskSymlinks(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "secret.txt")
	if err := os.WriteFile(secret, []byte("host secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{secret, "/proc/self/environ", "../outside.md"} {
		dir := writeTask(t, map[string]string{"task.toml": "[agent]\ntimeout_sec = 60\n"})
		if err := os.Symlink(target, filepath.Join(dir, "instruction.md")); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(filepath.Dir(dir), "outside.md"), []byte("outside"), 0o644)
		_, err := LoadTask(dir)
		checkFieldErr(t, err, wantErr{file: "instruction.md", msg: "a symlink out of the task folder"})
	}
	dir := writeTask(t, map[string]string{"task.toml": "[agent]\ntimeout_sec = 60\n", "prompts/main.md": "Do the thing."})
	if err := os.Symlink("prompts/main.md", filepath.Join(dir, "instruction.md")); err != nil {
		t.Fatal(err)
	}
	task, err := LoadTask(dir)
	if err != nil || task.Prompt != "Do the thing." {
		t.Fatalf("a link inside the task folder: %v, %+v", err, task)
	}
	dir = writeTask(t, map[string]string{"task.toml": "[agent]\ntimeout_sec = 60\n"})
	if err := os.Symlink("nothing.md", filepath.Join(dir, "instruction.md")); err != nil {
		t.Fatal(err)
	}
	_, err = LoadTask(dir)
	checkFieldErr(t, err, wantErr{file: "instruction.md", msg: "a symlink that does not resolve"})
}

// A timeout past 30 days is refused, naming the field: 1e12 seconds
// overflowed a duration into a negative one, which became the default.
func TestLoadTaskHugeTimeout(t *testing.T) {
	dir := writeTask(t, map[string]string{"task.toml": "[agent]\ntimeout_sec = 1e12\n", "instruction.md": "x"})
	_, err := LoadTask(dir)
	checkFieldErr(t, err, wantErr{file: "task.toml", line: 2, field: "agent.timeout_sec", msg: "longer than 2592000 seconds"})
}

// Documents that would cost far more to parse than their size suggests are
// refused before or while parsing: too many entries (a flow list of
// one-letter items costs a few hundred bytes of memory a byte), and keys
// so long that the field paths below them cost key × list.
func TestLoadTaskCostBounds(t *testing.T) {
	many := "---\nsandbox:\n  network_mode: denylist\n  blocked_hosts: [" + strings.Repeat("a,", MaxEntries) + "a]\n---\nx\n"
	dir := writeTask(t, map[string]string{"task.md": many})
	start := time.Now()
	_, err := LoadTask(dir)
	checkFieldErr(t, err, wantErr{file: "task.md", msg: "more than 1048576 entries"})
	if el := time.Since(start); el > 10*time.Second {
		t.Errorf("refusing took %v", el)
	}
	long := strings.Repeat("k", MaxKeyLen+1)
	// (YAML takes a plain key of at most 1024 characters; a longer one
	// must be written explicitly, after "? ".)
	dir = writeTask(t, map[string]string{"task.md": "---\nsandbox:\n  env:\n    ? " + long + "\n    : x\n---\nx\n"})
	_, err = LoadTask(dir)
	checkFieldErr(t, err, wantErr{file: "task.md", line: 4, field: "sandbox.env", msg: "a key of 1025 bytes, longer than 1024"})
	dir = writeTask(t, map[string]string{"task.toml": "[sandbox.env]\n" + long + " = \"x\"\n", "instruction.md": "x"})
	_, err = LoadTask(dir)
	checkFieldErr(t, err, wantErr{file: "task.toml", msg: "a key of 1025 bytes, longer than 1024"})
	_, err = parsePolicy("policy.yaml", []byte("network_mode: denylist\nblocked_hosts: ["+strings.Repeat("a,", MaxEntries)+"a]\n"))
	checkFieldErr(t, err, wantErr{file: "policy.yaml", msg: "more than 1048576 entries"})
}

// A policy file the operator names may be a symlink anywhere (a "current"
// link to a versioned policy); only task files keep to their folder.
func TestLoadPolicyFileThroughSymlink(t *testing.T) {
	real := filepath.Join(t.TempDir(), "v2.yaml")
	if err := os.WriteFile(real, []byte("network_mode: denylist\nblocked_hosts: [example.com]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "current.yaml")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	p, err := LoadPolicyFile(link)
	if err != nil || p.Mode != gate.Denylist {
		t.Fatalf("LoadPolicyFile through a symlink: %v, %+v", err, p)
	}
}

// What the runtime would refuse later is refused when the task loads, with
// file, line and field: a workdir under a folder the sandbox manages, an
// agent user that is a uid.
func TestLoadTaskRuntimeRules(t *testing.T) {
	for _, c := range []struct {
		yaml string
		want wantErr
	}{
		{"sandbox:\n  workdir: /logs/verifier\n", wantErr{file: "task.md", line: 3, field: "sandbox.workdir", msg: "lies under /logs"}},
		{"sandbox:\n  workdir: /usr\n", wantErr{file: "task.md", line: 3, field: "sandbox.workdir", msg: "is a system directory"}},
		{"agent:\n  user: \"00\"\n", wantErr{file: "task.md", line: 3, field: "agent.user", msg: "give a name, not a uid"}},
		{"agent:\n  user: \"1000\"\n", wantErr{file: "task.md", line: 3, field: "agent.user", msg: "give a name, not a uid"}},
	} {
		dir := writeTask(t, map[string]string{"task.md": "---\n" + c.yaml + "---\nx\n"})
		_, err := LoadTask(dir)
		checkFieldErr(t, err, c.want)
	}
}

// A task named by its folder may not carry control or format characters
// into terminals and logs.
func TestLoadTaskFolderNameControl(t *testing.T) {
	parent := t.TempDir()
	for _, name := range []string{"evil\x1b[2Jname", "c1\u009bname", "bidi\u202ename"} {
		dir := filepath.Join(parent, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "task.md"), []byte("---\nagent:\n  timeout_sec: 60\n---\nDo it.\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := LoadTask(dir)
		checkFieldErr(t, err, wantErr{file: "task.md", field: "task.name", msg: "holds control or format characters"})
	}
}
