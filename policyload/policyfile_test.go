package policyload

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"flowgate/gate"
)

func writePolicy(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadPolicyFile(t *testing.T) {
	p, err := LoadPolicyFile(writePolicy(t, `network_mode: denylist
blocked_urls:
  - https://example.org/papers/x
blocked_hosts:
  - mirror.example.net
`))
	if err != nil {
		t.Fatal(err)
	}
	var fields []string
	for _, r := range p.Rules {
		fields = append(fields, r.String())
	}
	want := []string{"blocked_hosts[0] mirror.example.net", "blocked_urls[0] https://example.org/papers/x"}
	if p.Mode != gate.Denylist || !reflect.DeepEqual(fields, want) {
		t.Errorf("mode %v rules %q, want denylist %q", p.Mode, fields, want)
	}

	for _, body := range []string{"", "# nothing\n", "{}\n"} {
		p, err := LoadPolicyFile(writePolicy(t, body))
		if err != nil || p.Mode != gate.Public || len(p.Rules) != 0 {
			t.Errorf("%q: %v %v, want the public policy", body, p, err)
		}
	}
	p, err = LoadPolicyFile(writePolicy(t, "network_mode: allowlist\nallowed_hosts: []\n"))
	if err != nil || p.Mode != gate.Allowlist || len(p.Rules) != 0 {
		t.Errorf("empty allowlist: %v %v", p, err)
	}
}

func TestLoadPolicyFileErrors(t *testing.T) {
	tests := []struct {
		name, body string
		want       wantErr
	}{
		{"unknown key", "network_mode: public\nsandbox: {}\n",
			wantErr{file: "policy.yaml", line: 2, field: "sandbox", msg: "unknown key", fix: "valid keys: network_mode, allowed_hosts, blocked_urls, blocked_hosts"}},
		{"task key", "network_mode: public\ndocker_image: x\n",
			wantErr{file: "policy.yaml", line: 2, field: "docker_image", msg: "unknown key", fix: "valid keys"}},
		{"bad mode", "network_mode: blocklist\n",
			wantErr{file: "policy.yaml", line: 1, field: "network_mode", value: "blocklist", msg: `did you mean "denylist"?`}},
		{"wrong mode for list", "network_mode: no-network\nblocked_hosts: [a.com]\n",
			wantErr{file: "policy.yaml", line: 2, field: "blocked_hosts", msg: "applies only to network_mode denylist", fix: "set network_mode: denylist"}},
		{"bad entry", "network_mode: allowlist\nallowed_hosts:\n  - a.com\n  - \"http://b.com\"\n",
			wantErr{file: "policy.yaml", line: 4, field: "allowed_hosts[1]", value: "http://b.com", msg: "a URL is not a host entry"}},
		{"two documents", "network_mode: public\n---\nnetwork_mode: denylist\n",
			wantErr{file: "policy.yaml", line: 2, msg: "more than one YAML document"}},
		{"alias", "a: &x [b.com]\nnetwork_mode: denylist\nblocked_hosts: *x\n",
			wantErr{file: "policy.yaml", line: 1, field: "a", msg: "anchors and aliases"}},
		{"not a table", "[a, b]\n", wantErr{file: "policy.yaml", line: 1, msg: "want a table, got a list"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := LoadPolicyFile(writePolicy(t, tt.body))
			checkFieldErr(t, err, tt.want)
		})
	}
	_, err := LoadPolicyFile(filepath.Join(t.TempDir(), "missing.yaml"))
	checkFieldErr(t, err, wantErr{file: "missing.yaml", msg: "no such file"})
}
