package main

import (
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"flowgate/gate/nstest"
	"flowgate/runtime"
)

func TestGCNothingToDo(t *testing.T) {
	h := nstest.New(t, "fgbgc")
	code, out, errs := runBench(t, "gc", "--state-dir", t.TempDir(), "--uplink-netns", h.Path)
	if code != 0 || out != "" || errs != "" {
		t.Errorf("bench gc on an empty state dir: exit %d, out %q, err %q", code, out, errs)
	}
}

// TestGCRemovesLeftover makes a sandbox, marks its owner dead in its
// record (as after a SIGKILL), and checks that bench gc removes it all.
func TestGCRemovesLeftover(t *testing.T) {
	h := nstest.New(t, "fgbgc")
	state := filepath.Join(t.TempDir(), "state")
	l := &runtime.Local{StateDir: state, Uplink: h.Path, DNS: []netip.Addr{netip.MustParseAddr("192.0.2.53")}}
	name := "bgc-" + strings.TrimPrefix(h.Name, "fgbgc-")
	sb, err := l.Create(context.Background(), runtime.Spec{Name: name, LogsDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	rec := filepath.Join(state, "sandboxes", name, "state.json")
	b, err := os.ReadFile(rec)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	m["owner"] = map[string]any{"pid": 0, "start": 0}
	b, _ = json.Marshal(m)
	if err := os.WriteFile(rec, b, 0o600); err != nil {
		t.Fatal(err)
	}

	code, out, errs := runBench(t, "gc", "--state-dir", state, "--uplink-netns", h.Path)
	if code != 0 || errs != "" {
		t.Fatalf("bench gc: exit %d, err %q", code, errs)
	}
	for _, want := range []string{
		"removed nft rules of " + name + " in inet flowgate_host",
		"removed nft table inet flowgate_host",
		"removed link " + sb.HostLink(),
		"removed netns fg-" + name,
		"removed state " + filepath.Join(state, "sandboxes", name),
	} {
		if !strings.Contains(out, want+"\n") && !strings.Contains(out, want+" (") {
			t.Errorf("bench gc output lacks %q:\n%s", want, out)
		}
	}
	if _, err := os.Stat(sb.NetNSPath()); !os.IsNotExist(err) {
		t.Errorf("netns %s is left: %v", sb.NetNSPath(), err)
	}
	if code, out, _ := runBench(t, "gc", "--state-dir", state, "--uplink-netns", h.Path); code != 0 || out != "" {
		t.Errorf("second bench gc: exit %d, out %q", code, out)
	}
}

func TestGCUnreadableState(t *testing.T) {
	h := nstest.New(t, "fgbgc")
	state := t.TempDir()
	dir := filepath.Join(state, "sandboxes", "broken")
	os.MkdirAll(dir, 0o700)
	os.WriteFile(filepath.Join(dir, "state.json"), []byte("{not json"), 0o600)
	code, _, errs := runBench(t, "gc", "--state-dir", state, "--uplink-netns", h.Path)
	if code != 1 || !strings.Contains(errs, "bench: gc: reading "+filepath.Join(dir, "state.json")) {
		t.Errorf("bench gc with a broken record: exit %d, err %q", code, errs)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Errorf("bench gc removed a record it could not read: %v", err)
	}
}
