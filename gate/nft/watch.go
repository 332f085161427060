package nft

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/mdlayher/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Event is one change to table inet flowgate that this process did not
// make: the objects one netlink transaction added or deleted, with the
// process the kernel says committed it. An Event with Err set means the
// watch may have missed changes (its socket overflowed) or stopped.
type Event struct {
	Time    time.Time
	PID     uint32 // the committing task's id in the kernel's initial pid namespace; 0 if unknown
	Comm    string // its command name
	Changes []Change
	// More counts changes left out of Changes to keep an Event small.
	More int
	Err  error
}

// Change is one object a transaction added or deleted.
type Change struct {
	Op      string // "add" or "delete"
	Object  string // "table", "chain", "rule", "set", "elements", "object", "flowtable"
	Name    string // the chain (of a rule) or set (of elements); empty for the table
	Handle  uint64 // a rule's handle
	Comment string // a rule's comment
	Count   int    // elements: how many
}

func (c Change) String() string {
	s := c.Op + " " + c.Object
	if c.Object == "elements" {
		s = fmt.Sprintf("%s %d elements", c.Op, c.Count)
		if c.Name != "" {
			s += " of set " + nameText(c.Name)
		}
		return s
	}
	if c.Name != "" {
		s += " " + nameText(c.Name)
	}
	if c.Handle != 0 {
		s += " handle " + strconv.FormatUint(c.Handle, 10)
	}
	if c.Comment != "" {
		s += " " + strconv.Quote(c.Comment)
	}
	return s
}

// String is one line: who changed what.
func (e Event) String() string {
	var b strings.Builder
	if e.Err != nil {
		b.WriteString("watch: " + e.Err.Error())
		if len(e.Changes) == 0 {
			return b.String()
		}
		b.WriteString("; ")
	}
	if e.PID != 0 || e.Comm != "" {
		fmt.Fprintf(&b, "pid %d (%s): ", e.PID, nameText(e.Comm))
	}
	for i, c := range e.Changes {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(c.String())
	}
	if e.More > 0 {
		fmt.Fprintf(&b, "; and %d more", e.More)
	}
	return b.String()
}

// maxChanges bounds the changes kept in one Event.
const maxChanges = 64

// watchBuffer is the monitor socket's receive buffer: large enough that a
// flood of element notifications does not overflow it.
const watchBuffer = 16 << 20

// Watch starts an nftables monitor inside the namespace and calls report
// for every transaction that changes table inet flowgate and was not made
// by this process (Apply, Remove, Learner), whatever it changed: the table,
// its chains, rules, sets or set elements. Watch returns once the monitor
// is listening. It runs until ctx is done (cancel ctx to release it); a
// report already under way may finish after that, no new one starts.
// report is called from the monitor's goroutine, one call at a time, and
// should not block for long: the kernel drops notifications it cannot
// queue, which is reported as an Event with Err.
func Watch(ctx context.Context, ns netns.NsHandle, report func(Event)) error {
	key, err := nsKey(ns)
	if err != nil {
		return fmt.Errorf("watching table inet %s: %w", TableName, err)
	}
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: int(ns)})
	if err != nil {
		return fmt.Errorf("watching table inet %s: opening netlink socket: %w", TableName, err)
	}
	if err := setReadBuffer(conn, watchBuffer); err != nil {
		conn.Close()
		return fmt.Errorf("watching table inet %s: %w", TableName, err)
	}
	if err := conn.JoinGroup(unix.NFNLGRP_NFTABLES); err != nil {
		conn.Close()
		return fmt.Errorf("watching table inet %s: joining the nftables group: %w", TableName, err)
	}
	w := &watcher{ctx: ctx, conn: conn, ns: key, report: report}
	go w.closeWhenDone()
	go w.run()
	return nil
}

// setReadBuffer raises the socket's receive buffer past the system limit
// (root may), falling back to what the limit allows.
func setReadBuffer(conn *netlink.Conn, n int) error {
	raw, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, n)
	}); err != nil {
		return err
	}
	if serr != nil {
		return conn.SetReadBuffer(n)
	}
	return nil
}

type watcher struct {
	ctx     context.Context
	conn    *netlink.Conn
	ns      nsID
	report  func(Event)
	pending Event
}

// closeWhenDone closes the socket when the context ends, which ends run.
func (w *watcher) closeWhenDone() {
	<-w.ctx.Done()
	w.conn.Close()
}

// run reads notifications until the socket is closed. Notifications of one
// transaction arrive before the NEWGEN message that ends it.
func (w *watcher) run() {
	for {
		msgs, err := w.conn.Receive()
		if w.ctx.Err() != nil {
			return
		}
		if err != nil {
			if errors.Is(err, unix.ENOBUFS) {
				w.pending = Event{}
				w.send(Event{Time: time.Now(), Err: errors.New("notifications were lost (receive buffer overflowed); the table may have changed unseen: audit it")})
				continue
			}
			w.send(Event{Time: time.Now(), Err: fmt.Errorf("monitor stopped: %w; later changes are not seen", err)})
			w.conn.Close()
			return
		}
		for _, m := range msgs {
			w.handle(m)
		}
	}
}

func (w *watcher) send(e Event) {
	if w.ctx.Err() == nil {
		w.report(e)
	}
}

func (w *watcher) handle(m netlink.Message) {
	if uint16(m.Header.Type)>>8 != unix.NFNL_SUBSYS_NFTABLES || len(m.Data) < 4 {
		return
	}
	typ := uint16(m.Header.Type) & 0xff
	attrs := parseAttrs(m.Data[4:])
	if typ == unix.NFT_MSG_NEWGEN {
		if len(w.pending.Changes) > 0 {
			e := w.pending
			e.Time = time.Now()
			if b := attrs[unix.NFTA_GEN_PROC_PID]; len(b) == 4 {
				e.PID = binary.BigEndian.Uint32(b)
			}
			e.Comm = cString(attrs[unix.NFTA_GEN_PROC_NAME])
			w.send(e)
		}
		w.pending = Event{}
		return
	}
	if m.Data[0] != unix.NFPROTO_INET || cString(attrs[1]) != TableName || own.has(w.ns, m.Header.PID) {
		return // another table, or our own change (attribute 1 is the table name in every object message)
	}
	c, ok := change(typ, attrs)
	if !ok {
		return
	}
	if len(w.pending.Changes) < maxChanges {
		w.pending.Changes = append(w.pending.Changes, c)
	} else {
		w.pending.More++
	}
}

// change describes an object notification.
func change(typ uint16, attrs map[uint16][]byte) (Change, bool) {
	var c Change
	switch typ {
	case unix.NFT_MSG_NEWTABLE, unix.NFT_MSG_DELTABLE:
		c.Object = "table"
	case unix.NFT_MSG_NEWCHAIN, unix.NFT_MSG_DELCHAIN:
		c.Object, c.Name = "chain", cString(attrs[unix.NFTA_CHAIN_NAME])
	case unix.NFT_MSG_NEWRULE, unix.NFT_MSG_DELRULE:
		c.Object, c.Name = "rule", cString(attrs[unix.NFTA_RULE_CHAIN])
		if b := attrs[unix.NFTA_RULE_HANDLE]; len(b) == 8 {
			c.Handle = binary.BigEndian.Uint64(b)
		}
		c.Comment = commentOf(attrs[unix.NFTA_RULE_USERDATA])
	case unix.NFT_MSG_NEWSET, unix.NFT_MSG_DELSET:
		c.Object, c.Name = "set", cString(attrs[unix.NFTA_SET_NAME])
	case unix.NFT_MSG_NEWSETELEM, unix.NFT_MSG_DELSETELEM:
		c.Object, c.Name = "elements", cString(attrs[unix.NFTA_SET_ELEM_LIST_SET])
		c.Count = len(parseAttrs(attrs[unix.NFTA_SET_ELEM_LIST_ELEMENTS]))
	case unix.NFT_MSG_NEWOBJ, unix.NFT_MSG_DELOBJ:
		c.Object, c.Name = "object", cString(attrs[unix.NFTA_OBJ_NAME])
	case unix.NFT_MSG_NEWFLOWTABLE, unix.NFT_MSG_DELFLOWTABLE:
		c.Object, c.Name = "flowtable", cString(attrs[2])
	default:
		return c, false
	}
	c.Op = "add"
	switch typ {
	case unix.NFT_MSG_DELTABLE, unix.NFT_MSG_DELCHAIN, unix.NFT_MSG_DELRULE, unix.NFT_MSG_DELSET,
		unix.NFT_MSG_DELSETELEM, unix.NFT_MSG_DELOBJ, unix.NFT_MSG_DELFLOWTABLE:
		c.Op = "delete"
	}
	return c, true
}

// parseAttrs reads one level of netlink attributes; a malformed list reads
// as far as it is well formed. Element lists repeat a type: the count of
// entries is what matters there, so repeated types get distinct keys.
func parseAttrs(b []byte) map[uint16][]byte {
	out := make(map[uint16][]byte)
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return out
	}
	for n := uint16(0); ad.Next(); n++ {
		t := ad.Type()
		if _, dup := out[t]; dup {
			t = 0x8000 | n
		}
		out[t] = ad.Bytes()
	}
	return out
}

func cString(b []byte) string {
	s := string(b)
	if i := strings.IndexByte(s, 0); i >= 0 {
		s = s[:i]
	}
	return s
}
