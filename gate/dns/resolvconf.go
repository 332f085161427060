package dns

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
)

// maxResolvConf bounds how much of a resolv.conf is read.
const maxResolvConf = 64 << 10

// maxNameservers is how many nameservers are used, as glibc does (MAXNS).
const maxNameservers = 3

// ReadResolvConf returns the nameservers of a resolv.conf as upstreams on
// port 53, in order, at most three. Loopback addresses (127.0.0.0/8, ::1)
// are skipped: they are a local stub such as systemd-resolved, which is
// not reachable from the sandbox's namespace and would forward outside it.
// It fails when a nameserver line holds no valid address, or when no usable
// nameserver remains.
func ReadResolvConf(path string) ([]netip.AddrPort, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading resolv.conf: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxResolvConf+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if len(data) > maxResolvConf {
		return nil, fmt.Errorf("reading %s: larger than %d bytes", path, maxResolvConf)
	}
	ups, err := parseResolvConf(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return ups, nil
}

// parseResolvConf reads nameserver lines; everything else is ignored.
func parseResolvConf(data []byte) ([]netip.AddrPort, error) {
	var (
		out     []netip.AddrPort
		skipped []string
	)
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), maxResolvConf)
	for line := 1; sc.Scan(); line++ {
		text := sc.Text()
		if i := strings.IndexAny(text, "#;"); i >= 0 {
			text = text[:i]
		}
		fields := strings.Fields(text)
		if len(fields) == 0 || fields[0] != "nameserver" {
			continue
		}
		if len(fields) != 2 {
			return nil, fmt.Errorf("line %d: nameserver takes one address, got %d fields", line, len(fields)-1)
		}
		a, err := netip.ParseAddr(fields[1])
		if err != nil {
			return nil, fmt.Errorf("line %d: nameserver %q is not an IP address", line, fields[1])
		}
		a = a.Unmap()
		if a.IsLoopback() {
			skipped = append(skipped, a.String())
			continue
		}
		if a.IsUnspecified() || a.IsMulticast() {
			return nil, fmt.Errorf("line %d: nameserver %s cannot be a resolver", line, a)
		}
		if len(out) < maxNameservers {
			out = append(out, netip.AddrPortFrom(a, 53))
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading lines: %w", err)
	}
	if len(out) == 0 {
		if len(skipped) > 0 {
			return nil, fmt.Errorf("only loopback nameservers (%s): a local stub resolver cannot be reached from the sandbox's namespace; configure an upstream resolver address instead", strings.Join(skipped, ", "))
		}
		return nil, fmt.Errorf("no nameserver lines")
	}
	return out, nil
}
