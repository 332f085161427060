package runtime

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"flowgate/gate/nstest"
)

// TestProbe: on this machine (root, nftables, cgroup v2 without net_cls)
// every piece is there, and the probe leaves no cgroup behind (its
// namespace is unnamed and goes with its last process).
func TestProbe(t *testing.T) {
	nstest.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := (&Local{}).Probe(ctx)
	want := Capabilities{Root: true, NFTables: true, OwnerMatch: true, IPv6: true, CgroupMatch: true}
	if c.Root != want.Root || c.NFTables != want.NFTables || c.OwnerMatch != want.OwnerMatch || c.IPv6 != want.IPv6 || c.CgroupMatch != want.CgroupMatch || len(c.Missing) != 0 {
		t.Errorf("Probe = %+v, want %+v", c, want)
	}
	if m := cgroup2Mount(); m != "" {
		ents, _ := os.ReadDir(filepath.Join(m, cgroupRoot))
		for _, e := range ents {
			if pid, ok := probeCgroupPID(e.Name()); ok && pid == os.Getpid() {
				t.Errorf("probe cgroup %s left", e.Name())
			}
		}
	}
}
