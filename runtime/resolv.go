package runtime

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
)

// hostResolvConf and resolvedUpstreams are where Local looks for the
// host's resolvers when Local.DNS is empty.
var (
	hostResolvConf    = "/etc/resolv.conf"
	resolvedUpstreams = "/run/systemd/resolve/resolv.conf"
)

// parseNameservers returns the addresses of a resolv.conf's nameserver
// lines, in order, skipping entries that are not addresses.
func parseNameservers(b []byte) []netip.Addr {
	var out []netip.Addr
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), 64*1024)
	for sc.Scan() {
		line := sc.Text()
		if i := strings.IndexAny(line, "#;"); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "nameserver" {
			continue
		}
		a, err := netip.ParseAddr(f[1])
		if err != nil {
			continue
		}
		out = append(out, a)
	}
	return out
}

// usableResolvers keeps the addresses a sandbox can reach through the
// uplink: no loopback stub, no link-local or zoned address, no
// unspecified or multicast address.
func usableResolvers(in []netip.Addr) (keep, dropped []netip.Addr) {
	for _, a := range in {
		a = a.Unmap()
		if a.IsLoopback() || a.IsLinkLocalUnicast() || a.Zone() != "" || a.IsUnspecified() || a.IsMulticast() {
			dropped = append(dropped, a)
			continue
		}
		keep = append(keep, a)
	}
	return keep, dropped
}

// resolvers returns Local.DNS, or the host's usable resolvers.
func (l *Local) resolvers() ([]netip.Addr, error) {
	if len(l.DNS) > 0 {
		keep, dropped := usableResolvers(l.DNS)
		if len(dropped) > 0 {
			return nil, fmt.Errorf("--dns %v: a sandbox cannot reach a loopback, link-local, multicast or unspecified resolver; give one it reaches through the host's network", dropped[0])
		}
		return keep, nil
	}
	b, err := os.ReadFile(hostResolvConf)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("reading the host's resolvers: %w", err)
	}
	all := parseNameservers(b)
	keep, dropped := usableResolvers(all)
	if len(keep) == 0 && len(dropped) > 0 {
		// systemd-resolved's stub (127.0.0.53): its upstreams are listed
		// in a file of their own.
		if ub, err := os.ReadFile(resolvedUpstreams); err == nil {
			keep, _ = usableResolvers(parseNameservers(ub))
		}
	}
	if len(keep) == 0 {
		what := "lists no nameserver"
		if len(dropped) > 0 {
			what = fmt.Sprintf("lists only %v, which a sandbox cannot reach", dropped)
		}
		return nil, fmt.Errorf("no resolver for the sandbox: %s %s; pass --dns ADDR with a resolver reachable through the host's network", hostResolvConf, what)
	}
	return keep, nil
}

// resolvConf renders the sandbox's resolv.conf.
func resolvConf(addrs []netip.Addr) []byte {
	var b bytes.Buffer
	b.WriteString("# written by flowgate for this sandbox\n")
	for _, a := range addrs {
		fmt.Fprintf(&b, "nameserver %s\n", a)
	}
	return b.Bytes()
}

// hostsFile renders the sandbox's /etc/hosts.
func hostsFile(hostname string) []byte {
	return fmt.Appendf(nil, "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t%s\n", hostname)
}
