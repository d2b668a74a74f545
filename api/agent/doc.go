// Package agent is a client of dipamd's Agent service (dipam.v1.Agent): the addresses dipamd
// holds for a network agent on its node (router, health, ingress, and claims of the agent's
// own), allocated through the node's delegated IPAM and never handed to a pod.
//
// The generated code is in example.invalid/dipam/api/agent/v1 (package agentv1); this
// package adds what every agent otherwise writes itself:
//
//   - [Dial]: the unix socket, with no TLS and no :authority setting (dipamd accepts any);
//   - [Client.List], [Client.Allocate], [Client.Release], [Client.Claim], [Client.Unclaim],
//     each with protocol_version set;
//   - [Client.Watch]: the list, again after every change, across dipamd's restarts: it
//     reconnects with backoff and resumes by (instance_id, generation), never delivering a
//     message older than one it delivered;
//   - errors mapped from the gRPC status code, never from its message: test them with
//     errors.Is against [ErrInvalidArgument] and the others, or read [Error].Code.
//
// # Who may call
//
// dipamd reads the caller's uid from the socket (SO_PEERCRED): there is nothing to configure
// in the client. The Agent service answers root and the uids of dipamd's --admin-uid; any
// other caller gets [ErrPermissionDenied] (a uid that may not open the socket at all gets
// [ErrUnavailable] or a permission error from connect). The socket is mode 0600, or 0660 with
// dipamd's --socket-group, so a non-root agent needs both: the socket's group, and its uid in
// --admin-uid. In Kubernetes, share /run/dipam with the agent's pod through a hostPath.
//
// # Versions
//
// The module follows semantic import versioning. dipam.v1 only grows (new fields, new calls)
// and such changes are minor releases of this module. A change dipam.v1 cannot absorb would be
// a new proto package, dipam.v2, served by dipamd beside dipam.v1 and generated into new
// packages of this module (agent/v2); a breaking change of this client's Go API would be a
// new major version of the module, example.invalid/dipam/api/v2. docs/agent-api.md has the
// rest: every call, field and error code.
package agent
