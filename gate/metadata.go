package gate

import "net/netip"

// MetadataPrefixes are the cloud metadata destinations refused in every
// mode: link-local (AWS, GCP, Azure IMDS, OpenStack, DigitalOcean, Oracle),
// Azure's wire server, Alibaba's metadata server, AWS's and Huawei's IPv6
// metadata addresses, and the NAT64 (64:ff9b::/96) forms of the IPv4 ones.
var MetadataPrefixes = []netip.Prefix{
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("168.63.129.16/32"),
	netip.MustParsePrefix("100.100.100.200/32"),
	netip.MustParsePrefix("fd00:ec2::254/128"),
	netip.MustParsePrefix("fd20:ce::254/128"),
	netip.MustParsePrefix("64:ff9b::a9fe:0/112"),
	netip.MustParsePrefix("64:ff9b::a83f:8110/128"),
	netip.MustParsePrefix("64:ff9b::6464:64c8/128"),
}

// MetadataNames are host names that only ever lead to a metadata service.
// They are refused by the DNS proxy and by SNI/Host routing in every proxied
// mode; in public mode the address rules refuse them.
var MetadataNames = []string{
	"metadata.google.internal",
	"metadata.goog",
	"instance-data.ec2.internal",
	"metadata.azure.com",
}

var metadataRules = func() (*PrefixSet, *HostSet) {
	ps := &PrefixSet{}
	for _, p := range MetadataPrefixes {
		ps.Add(p, &Rule{Kind: KindMetadata, Field: "builtin", Written: p.String(), Canonical: p.String(), Prefix: p})
	}
	hs := NewHostSet(len(MetadataNames))
	for _, n := range MetadataNames {
		hs.addApex(n, &Rule{Kind: KindMetadata, Field: "builtin", Written: n, Canonical: n})
	}
	return ps, hs
}

var metadataAddrs, metadataHosts = metadataRules()

// IsMetadata reports the metadata rule holding a, or nil.
func IsMetadata(a netip.Addr) *Rule { return metadataAddrs.Match(a) }
