// Package sni is flowgate's TCP data plane inside one sandbox: the
// transparent port, which receives the agent's redirected TCP and decides it
// by what the client sends first (a TLS ClientHello by its SNI, an HTTP
// request by its Host and path, anything else by its destination address),
// and the explicit proxy port (CONNECT and absolute-form HTTP).
//
// It owns: reading the original destination, peeking (never consuming) the
// first bytes of a stream, binding a claimed name to the destination address,
// answering refusals (an access_denied alert for TLS, 403 for HTTP), checking
// every HTTP request on a connection, and splicing allowed TLS and TCP
// streams with splice(2). Each decision yields one gate.Record: one per
// connection (TLS, TCP, CONNECT), one per HTTP request.
//
// It never decrypts TLS (a host that needs its paths checked over HTTPS is
// refused, not intercepted), never resolves names by itself (Config.Resolve
// does, through the sandbox's resolver), never opens sockets outside the
// sandbox (Config.Dial does, and the gateway opens the listeners), and never
// touches nftables.
package sni
