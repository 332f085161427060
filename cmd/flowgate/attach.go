package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"github.com/vishvananda/netns"

	"flowgate/gate/gateway"
	"flowgate/gate/nft"
	"flowgate/policyload"
)

// nsFlags select a network namespace by path or by a process in it.
type nsFlags struct {
	path string
	pid  int
}

func (f *nsFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.path, "netns", "", "network namespace path (/run/netns/NAME, /proc/PID/ns/net)")
	cmd.Flags().IntVar(&f.pid, "pid", 0, "a process whose network namespace to use")
}

// open returns a handle on the namespace; the caller closes it.
func (f *nsFlags) open() (netns.NsHandle, error) {
	switch {
	case f.path != "" && f.pid != 0:
		return -1, errors.New("give --netns or --pid, not both")
	case f.path != "":
		h, err := netns.GetFromPath(f.path)
		if err != nil {
			return -1, fmt.Errorf("opening netns %s: %w", f.path, err)
		}
		return h, nil
	case f.pid > 0:
		h, err := netns.GetFromPid(f.pid)
		if err != nil {
			return -1, fmt.Errorf("opening netns of pid %d: %w", f.pid, err)
		}
		return h, nil
	case f.pid < 0:
		return -1, fmt.Errorf("--pid %d: not a process id", f.pid)
	}
	return -1, errors.New("give the namespace: --netns PATH or --pid PID")
}

// resolvConf is where the sandbox's resolv.conf is: inside the process's
// root for --pid, the `ip netns` per-namespace file when there is one, else
// the host's.
func (f *nsFlags) resolvConf() string {
	if f.pid > 0 {
		return fmt.Sprintf("/proc/%d/root/etc/resolv.conf", f.pid)
	}
	if strings.HasPrefix(f.path, "/run/netns/") || strings.HasPrefix(f.path, "/var/run/netns/") {
		p := filepath.Join("/etc/netns", filepath.Base(f.path), "resolv.conf")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return "/etc/resolv.conf"
}

func init() {
	var (
		ns         nsFlags
		uid        int
		policyPath string
		logPath    string
		logMax     int64
		resolvConf string
		dnsAddrs   []string
		sandbox    string
		cgroup     string
		metrics    string
		verbose    bool
	)
	cmd := &cobra.Command{
		Use:   "attach (--netns PATH | --pid PID) --uid N --policy FILE",
		Short: "Enforce a policy for a uid in a network namespace, in the foreground",
		Long: `attach applies flowgate's nftables table in the namespace and runs its DNS proxy
and TCP data plane there until interrupted. Every decision is written as one JSON
line to --log (default: standard output), up to --log-max bytes; past them
decisions are counted, and written on exit as one line per kind with a count.

It fails closed: when attach stops or dies, its rules stay, so the uid has no
proxied egress until 'flowgate detach' removes them (or attach runs again).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if uid <= 0 || uid > 1<<31 {
				return &exitError{code: 2, err: fmt.Errorf("--uid %d: give the agent's uid, a number above 0", uid)}
			}
			if policyPath == "" {
				return &exitError{code: 2, err: errors.New("--policy FILE is required")}
			}
			if logMax < 0 {
				return &exitError{code: 2, err: fmt.Errorf("--log-max %d: want a size in bytes, or 0 for no bound", logMax)}
			}
			policy, err := policyload.LoadPolicyFile(policyPath)
			if err != nil {
				return &exitError{code: 2, err: err}
			}
			var resolvers []netip.AddrPort
			for _, a := range dnsAddrs {
				ap, err := parseResolver(a)
				if err != nil {
					return &exitError{code: 2, err: err}
				}
				resolvers = append(resolvers, ap)
			}
			h, err := ns.open()
			if err != nil {
				return &exitError{code: 2, err: err}
			}
			defer h.Close()
			if resolvConf == "" {
				resolvConf = ns.resolvConf()
			}
			out := cmd.OutOrStdout()
			if logPath != "" && logPath != "-" {
				f, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
				if err != nil {
					return &exitError{code: 2, err: fmt.Errorf("opening --log: %w", err)}
				}
				defer f.Close()
				out = f
			}
			level := slog.LevelInfo
			if verbose {
				level = slog.LevelDebug
			}
			logger := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))
			egress := gateway.NewJSONLogLimit(out, logMax)
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if metrics != "" {
				srv, err := serveMetrics(metrics)
				if err != nil {
					return &exitError{code: 2, err: err}
				}
				defer srv.Close()
			}
			gw, err := gateway.Attach(h, uint32(uid), policy, gateway.Options{
				Sandbox: sandbox, Cgroup: cgroup, Resolvers: resolvers, ResolvConf: resolvConf,
				Record: egress, Logger: logger,
				OnTamper: func(ev nft.Event) { logger.Error("run compromised: flowgate table changed", "event", ev.String()) },
			})
			if err != nil {
				return err
			}
			logger.Info("attached", "sandbox", sandbox, "uid", uid, "mode", policy.Mode.String())
			<-ctx.Done()
			err = errors.Join(gw.Close(), egress.Close())
			logger.Info("stopped; rules stay until 'flowgate detach'", "sandbox", sandbox)
			if gw.Tampered() {
				return &exitError{code: 3, err: errors.Join(err, errors.New("the flowgate table was changed by someone else while attached"))}
			}
			return err
		},
	}
	ns.add(cmd)
	cmd.Flags().IntVar(&uid, "uid", 0, "the agent's uid whose traffic is filtered")
	cmd.Flags().StringVar(&policyPath, "policy", "", "policy file (YAML: network_mode, allowed_hosts, blocked_hosts, blocked_urls)")
	cmd.Flags().StringVar(&logPath, "log", "", "egress log file, one JSON line per decision (default: standard output)")
	cmd.Flags().Int64Var(&logMax, "log-max", 1<<30, "bytes the egress log may take; past them decisions are counted and summed up on exit (0: no bound)")
	cmd.Flags().StringVar(&resolvConf, "resolv-conf", "", "the sandbox's resolv.conf (default: found from --netns/--pid)")
	cmd.Flags().StringSliceVar(&dnsAddrs, "dns", nil, "upstream resolver ADDR[:PORT] (repeatable; overrides the resolv.conf)")
	cmd.Flags().StringVar(&sandbox, "sandbox", "flowgate", "sandbox name for rule comments and the log ([a-z0-9-], at most 32)")
	cmd.Flags().StringVar(&cgroup, "cgroup", "", "also filter sockets of this cgroup v2 path")
	cmd.Flags().StringVar(&metrics, "metrics", "", "serve Prometheus metrics on this host address (e.g. 127.0.0.1:9464)")
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "debug logging")
	rootCmd.AddCommand(cmd)

	var dns nsFlags
	detach := &cobra.Command{
		Use:   "detach (--netns PATH | --pid PID)",
		Short: "Remove flowgate's table from a namespace, restoring its plain network",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			h, err := dns.open()
			if err != nil {
				return &exitError{code: 2, err: err}
			}
			defer h.Close()
			return gateway.Detach(h)
		},
	}
	dns.add(detach)
	rootCmd.AddCommand(detach)
}

// parseResolver reads ADDR or ADDR:PORT (IPv6 in brackets with a port).
func parseResolver(s string) (netip.AddrPort, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap, nil
	}
	a, err := netip.ParseAddr(strings.Trim(s, "[]"))
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("--dns %q: want an IP address, optionally with :port", s)
	}
	return netip.AddrPortFrom(a, 53), nil
}

// serveMetrics serves the gateway's metrics on addr in the host namespace.
func serveMetrics(addr string) (*http.Server, error) {
	reg := prometheus.NewRegistry()
	for _, c := range gateway.Collectors() {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering metrics: %w", err)
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	return srv, nil
}
