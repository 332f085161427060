package sni

import (
	"sync"

	"golang.org/x/sys/unix"
)

// The process's descriptors bound the connections it can serve, whatever
// MaxConns each Server has: a spliced connection holds the client's and the
// upstream's sockets and, while the kernel splices, a pipe (two
// descriptors) each way. A Server whose connections took every descriptor
// would leave the gateway unable to open a DNS socket, a log line's file or
// another sandbox's connection, so every Server of the process also takes
// a slot of one budget sized from RLIMIT_NOFILE, minus a reserve for
// everything else.

// fdsPerConn is the most descriptors one connection holds.
const fdsPerConn = 6

// processSlots is the process-wide connection budget; a variable so that
// tests can make it small.
var processSlots = sync.OnceValue(func() chan struct{} {
	var lim unix.Rlimit
	nofile := uint64(1024)
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err == nil {
		nofile = lim.Cur
	}
	return make(chan struct{}, connBudget(nofile))
})

// connBudget is how many connections a process with nofile descriptors
// serves at once: a quarter of them (at most 1024) kept for everything
// else, the rest at fdsPerConn each, and never fewer than 16.
func connBudget(nofile uint64) int {
	reserve := min(nofile/4, 1024)
	return max(int(min((nofile-reserve)/fdsPerConn, 1<<20)), 16)
}
