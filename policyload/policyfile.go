package policyload

import (
	"reflect"

	"flowgate/gate"
)

// policyFile is a standalone flowgate policy: the network keys of a
// sandbox section, at the top level of a YAML file.
type policyFile struct {
	NetworkMode  string   `key:"network_mode"`
	AllowedHosts []string `key:"allowed_hosts"`
	BlockedURLs  []string `key:"blocked_urls"`
	BlockedHosts []string `key:"blocked_hosts"`
}

// LoadPolicyFile reads a standalone policy file for flowgate: YAML with the
// keys network_mode, allowed_hosts, blocked_urls and blocked_hosts, and no
// others. An empty file is the public policy. Entries carry field paths
// such as "blocked_hosts[0]".
func LoadPolicyFile(path string) (*gate.Policy, error) {
	data, ok, err := readFile(path, false)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fieldErr(path, 0, "", "", "no such file", "")
	}
	return parsePolicy(path, data)
}

// parsePolicy is LoadPolicyFile on bytes; file names them in errors.
func parsePolicy(file string, data []byte) (*gate.Policy, error) {
	root, err := parseYAML(file, data, 0)
	if err != nil {
		return nil, err
	}
	p := &parsed{file: file, d: &decoder{file: file, lines: make(map[string]int)}}
	var pf policyFile
	if root.kind != kindNull {
		if err := p.d.decodeStruct(root, "", reflect.ValueOf(&pf).Elem()); err != nil {
			return nil, err
		}
	}
	spec := gate.Spec{ModeField: "network_mode"}
	if p.present("network_mode") {
		if spec.Mode, err = p.parseMode("network_mode", pf.NetworkMode); err != nil {
			return nil, err
		}
	}
	spec.AllowedHosts = entries("allowed_hosts", pf.AllowedHosts)
	spec.BlockedURLs = entries("blocked_urls", pf.BlockedURLs)
	spec.BlockedHosts = entries("blocked_hosts", pf.BlockedHosts)
	return p.compile(spec)
}
