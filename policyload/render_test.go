package policyload

import (
	"errors"
	"strings"
	"testing"

	"flowgate/gate"
)

func TestRenderPolicy(t *testing.T) {
	tests := []struct {
		front string
		want  string
	}{
		{"sandbox:\n  network_mode: public\n", `network_mode  public    the internet, except cloud metadata addresses
deny          metadata  cloud metadata services  builtin (8 address ranges, 4 names)
`},
		{"sandbox:\n  network_mode: denylist\n  blocked_hosts: [Mirror.Example.NET., 198.51.100.7]\n  blocked_urls: [\"https://example.org/a/../papers/x\"]\n",
			`network_mode  denylist  the internet, minus the rules below
deny          host      mirror.example.net            sandbox.blocked_hosts[0]  (written "Mirror.Example.NET.")
deny          cidr      198.51.100.7/32               sandbox.blocked_hosts[1]  (written "198.51.100.7")
deny          url       https://example.org/papers/x  sandbox.blocked_urls[0]   (written "https://example.org/a/../papers/x")
deny          metadata  cloud metadata services       builtin (8 address ranges, 4 names)
`},
		{"sandbox:\n  network_mode: allowlist\n  allowed_hosts: []\n", `network_mode  allowlist  only the model (allowed_hosts is empty)
deny          metadata   cloud metadata services  builtin (8 address ranges, 4 names)
`},
		{"agent:\n  network_mode: allowlist\n  allowed_hosts: [\"*.pythonhosted.org\", db]\n", `network_mode  allowlist  only the rules below, plus the model
allow         wildcard   *.pythonhosted.org       agent.allowed_hosts[0]
allow         service    db                       agent.allowed_hosts[1]
deny          metadata   cloud metadata services  builtin (8 address ranges, 4 names)
`},
	}
	for _, tt := range tests {
		task := mustLoad(t, map[string]string{"task.md": md(tt.front)})
		got := RenderPolicy(task.Policy)
		if got != tt.want {
			t.Errorf("%q:\n got:\n%s\nwant:\n%s", tt.front, got, tt.want)
		}
		if again := RenderPolicy(task.Policy); again != got {
			t.Errorf("not deterministic")
		}
	}
	if RenderPolicy(nil) != "no policy\n" {
		t.Error("nil policy")
	}
}

func TestCheckCapabilities(t *testing.T) {
	full := Capabilities{Runtime: "local", Modes: map[gate.Mode]bool{gate.Public: true, gate.NoNetwork: true, gate.Denylist: true, gate.Allowlist: true},
		IPv6: true, URLInterception: true}
	noProxy := Capabilities{Runtime: "containerd", Modes: map[gate.Mode]bool{gate.Public: true, gate.NoNetwork: true},
		Reasons: map[gate.Mode]string{gate.Denylist: "no transparent proxy in this runtime"}}
	limited := full
	limited.Runtime, limited.IPv6, limited.URLInterception = "basic", false, false

	denyURL := mustLoad(t, map[string]string{"task.md": md("sandbox:\n  network_mode: denylist\n  blocked_urls: [\"http://example.org/x\", \"https://example.org/y\"]\n  blocked_hosts: [\"2001:db8::/32\", 198.51.100.0/24]\n")}).Policy
	allow6 := mustLoad(t, map[string]string{"task.md": md("sandbox:\n  network_mode: allowlist\n  allowed_hosts: [\"2001:db8::1\"]\n")}).Policy
	public := mustLoad(t, map[string]string{"task.md": md("sandbox: {}\n")}).Policy
	allow := mustLoad(t, map[string]string{"task.md": md("sandbox:\n  network_mode: allowlist\n")}).Policy

	tests := []struct {
		name string
		p    *gate.Policy
		c    Capabilities
		want []string // one substring per expected error, in order; nil for none
	}{
		{"everything", denyURL, full, nil},
		{"public anywhere it runs", public, noProxy, nil},
		{"missing mode with reason", denyURL, noProxy, []string{`sandbox runtime "containerd" cannot enforce network_mode denylist: no transparent proxy in this runtime; the task is refused`}},
		{"missing mode without reason", allow, noProxy, []string{"cannot enforce network_mode allowlist: the runtime does not support this mode"}},
		{"zero capabilities refuse all", public, Capabilities{}, []string{"cannot enforce network_mode public"}},
		{"URL and IPv6 rules", denyURL, limited, []string{
			`cannot enforce sandbox.blocked_hosts[0] 2001:db8::/32: an IPv6 rule needs IPv6 filtering`,
			`cannot enforce sandbox.blocked_urls[1] https://example.org/y: blocking a URL path over HTTPS needs TLS interception`,
		}},
		{"IPv6 allow rule", allow6, limited, []string{"cannot enforce sandbox.allowed_hosts[0] 2001:db8::1/128"}},
	}
	for _, tt := range tests {
		err := CheckCapabilities(tt.p, tt.c)
		if tt.want == nil {
			if err != nil {
				t.Errorf("%s: %v", tt.name, err)
			}
			continue
		}
		var all []error
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			all = j.Unwrap()
		} else if err != nil {
			all = []error{err}
		}
		if len(all) != len(tt.want) {
			t.Errorf("%s: %d errors (%v), want %d", tt.name, len(all), err, len(tt.want))
			continue
		}
		for i, w := range tt.want {
			var ue *UnenforceableError
			if !errors.As(all[i], &ue) || !strings.Contains(all[i].Error(), w) {
				t.Errorf("%s: error %d = %v, want *UnenforceableError containing %q", tt.name, i, all[i], w)
			}
		}
	}
}
