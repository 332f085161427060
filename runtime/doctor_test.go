package runtime

import (
	"slices"
	"testing"

	"flowgate/gate"
)

func TestParseProbe(t *testing.T) {
	out := "example.com 35 000 curl: (35) OpenSSL SSL_connect: Connection reset by peer \n" +
		"pypi.org 0 200 \n" +
		"metadata 7 000 curl: (7) Failed to connect to 169.254.169.254 port 80 \n" +
		"model 0 502 \n"
	reached, detail, err := parseProbe(out)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(reached, []bool{false, true, false, false}) {
		t.Errorf("reached = %v", reached)
	}
	want := []string{"refused: TLS refused", "HTTP 200", "refused: connection refused", "refused: HTTP 502"}
	if !slices.Equal(detail, want) {
		t.Errorf("detail = %q, want %q", detail, want)
	}
	if _, _, err := parseProbe("pypi.org 0 200\n"); err == nil {
		t.Error("a probe missing three results was accepted")
	}
}

func TestExpectedAndPolicies(t *testing.T) {
	for _, m := range []gate.Mode{gate.Public, gate.NoNetwork, gate.Denylist, gate.Allowlist} {
		p, err := doctorPolicy(m)
		if err != nil {
			t.Fatalf("%s: %v", m, err)
		}
		want := Expected(m)
		// The policy and the expectation must agree on the two sites.
		for i, site := range []string{"example.com", "pypi.org"} {
			if got := p.Name(site).Allow; got != want[i] {
				t.Errorf("%s: policy allows %s = %v, expectation says %v", m, site, got, want[i])
			}
		}
		if want[2] || !want[3] {
			t.Errorf("%s: metadata must be refused and the model reached in every mode", m)
		}
	}
}
