package gate

import (
	"context"
	"net"
	"net/netip"
)

// Ports are flowgate's listening ports on 127.0.0.1 and ::1 inside a
// sandbox's namespace.
type Ports struct {
	DNS         uint16 // the DNS proxy, UDP and TCP; the agent's port-53 traffic is redirected here
	Transparent uint16 // redirected TCP (TLS by SNI, HTTP by Host, other TCP by address)
	Proxy       uint16 // the explicit proxy: CONNECT and absolute-form HTTP
}

// DefaultPorts are used when a caller sets none. Each sandbox has its own
// namespace, so the same ports serve every sandbox.
var DefaultPorts = Ports{DNS: 15353, Transparent: 15001, Proxy: 15080}

// DialFunc opens an upstream connection. The gateway hands the data plane one
// that opens its sockets inside the sandbox's namespace, as root, so they
// leave through the sandbox's own network and are not matched by the
// agent's rules.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// ResolveFunc resolves a canonical name to its addresses through the
// sandbox's resolver and records them in the Names table. The SNI and HTTP
// paths use it to check that a destination belongs to the name it claims.
type ResolveFunc func(ctx context.Context, name string) ([]netip.Addr, error)
