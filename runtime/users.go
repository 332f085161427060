package runtime

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// firstFreeUID is where the search for an agent uid starts when the host
// has no user of the agent's name; it stays clear of distribution ranges.
const firstFreeUID = 60100

// lastFreeUID is the highest uid the search takes (65534 is nobody).
const lastFreeUID = 65533

// passwdEntry is one line of a passwd file.
type passwdEntry struct {
	Name     string
	UID, GID uint32
	Line     string
}

// parseIDFile reads passwd lines (name:pw:uid:gid:gecos:home:shell) or,
// with isPasswd false, group lines (name:pw:gid:members, the gid read into
// UID). Lines that do not parse are kept as text with no name, so
// rendering keeps the file as it was.
func parseIDFile(b []byte, isPasswd bool) []passwdEntry {
	var out []passwdEntry
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		e := passwdEntry{Line: line}
		f := strings.Split(line, ":")
		if len(f) > 2 && f[0] != "" && !strings.HasPrefix(f[0], "#") && !strings.HasPrefix(f[0], "+") && !strings.HasPrefix(f[0], "-") {
			if id, err := strconv.ParseUint(f[2], 10, 32); err == nil {
				e.Name, e.UID = f[0], uint32(id)
				if isPasswd && len(f) > 3 {
					if g, err := strconv.ParseUint(f[3], 10, 32); err == nil {
						e.GID = uint32(g)
					}
				}
			}
		}
		out = append(out, e)
	}
	return out
}

// agentIDs chooses the agent's uid and gid: the host user's, if the host
// has a non-root user of that name, else the lowest id from firstFreeUID
// that neither the passwd nor the group file uses.
func agentIDs(user string, passwd, group []passwdEntry) (uid, gid uint32, err error) {
	for _, e := range passwd {
		if e.Name == user {
			if e.UID == 0 || e.GID == 0 {
				return 0, 0, fmt.Errorf("sandbox user %q is uid %d gid %d on this host; the agent must not run as root: choose another --sandbox-user", user, e.UID, e.GID)
			}
			return e.UID, e.GID, nil
		}
	}
	used := make(map[uint32]bool)
	for _, e := range passwd {
		if e.Name != "" {
			used[e.UID] = true
		}
	}
	for _, e := range group {
		if e.Name != "" {
			used[e.UID] = true // a group file's id column
		}
	}
	for id := uint32(firstFreeUID); id <= lastFreeUID; id++ {
		if !used[id] {
			return id, id, nil
		}
	}
	return 0, 0, fmt.Errorf("no free uid between %d and %d for the sandbox user %q", firstFreeUID, lastFreeUID, user)
}

// userFiles are the account files written into the sandbox's /etc.
type userFiles struct {
	passwd, group, shadow, gshadow []byte
}

// renderUsers returns the sandbox's account files: the host's users and
// groups with the agent's entries in place of any of the same name, and
// shadow files that lock every password (the host's hashes never enter
// the sandbox).
func renderUsers(user string, uid, gid uint32, shell string, passwd, group []passwdEntry) userFiles {
	var pw, gr, sh, gsh bytes.Buffer
	hasGroup := false
	for _, e := range passwd {
		if e.Name == user {
			continue
		}
		pw.WriteString(e.Line + "\n")
		if e.Name != "" {
			fmt.Fprintf(&sh, "%s:*:1:0:99999:7:::\n", e.Name)
		}
	}
	fmt.Fprintf(&pw, "%s:x:%d:%d:flowgate agent:/home/%s:%s\n", user, uid, gid, user, shell)
	fmt.Fprintf(&sh, "%s:*:1:0:99999:7:::\n", user)
	for _, e := range group {
		if e.Name == user && e.UID != gid {
			continue
		}
		if e.Name != "" && e.UID == gid {
			hasGroup = true
		}
		gr.WriteString(e.Line + "\n")
		if e.Name != "" {
			fmt.Fprintf(&gsh, "%s:*::\n", e.Name)
		}
	}
	if !hasGroup {
		fmt.Fprintf(&gr, "%s:x:%d:\n", user, gid)
		fmt.Fprintf(&gsh, "%s:*::\n", user)
	}
	return userFiles{passwd: pw.Bytes(), group: gr.Bytes(), shadow: sh.Bytes(), gshadow: gsh.Bytes()}
}

// hostUsers reads the host's passwd and group files.
func hostUsers() (passwd, group []passwdEntry, err error) {
	pb, err := os.ReadFile("/etc/passwd")
	if err != nil {
		return nil, nil, fmt.Errorf("reading the host's users: %w", err)
	}
	gb, err := os.ReadFile("/etc/group")
	if err != nil {
		return nil, nil, fmt.Errorf("reading the host's groups: %w", err)
	}
	return parseIDFile(pb, true), parseIDFile(gb, false), nil
}

// agentShell is the agent's login shell: bash when the host has it.
func agentShell() string {
	if fi, err := os.Stat("/bin/bash"); err == nil && fi.Mode().IsRegular() {
		return "/bin/bash"
	}
	return "/bin/sh"
}
