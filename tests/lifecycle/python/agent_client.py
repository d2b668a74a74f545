"""An agent written against dipam.v1 with nothing but Python grpcio and stubs generated from
proto/ (tests/lifecycle/tests/agent_api.rs generates them with grpcio-tools and runs this).

It connects as the grpcio documentation shows for a unix socket, with no channel option:
in particular no `grpc.default_authority`, so C-core sends the percent-encoded socket path as
`:authority` (grpc/grpc#34305), which dipamd must accept. Then it does what an agent does at
start-up: health, discovery through server reflection, List, Watch, enabling a role and
seeing its address arrive on the watch, disabling it and seeing it go; then claiming an
address of its own (a requested IP, labels), seeing it ready on the watch, unclaiming it and
seeing it go; and the error codes of requests dipamd refuses.

Every check fails with a message naming what differed; the last line on stdout is a JSON
summary the Rust test compares with what dipamctl reports.
"""

import argparse
import json
import queue
import sys
import threading

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from google.protobuf.descriptor_pool import DescriptorPool

TIMEOUT = 30.0


def fail(what):
    print(f"FAILED: {what}", file=sys.stderr)
    sys.exit(1)


def check(cond, what):
    if not cond:
        fail(what)


def rows(reply):
    """(role, family, ip, state) of every address, sorted: what an agent acts on."""
    return sorted((a.role, a.family, a.ip, a.state) for a in reply.addresses)


class Watcher:
    """One Agent.Watch stream read on its own thread, so that every wait has a bound."""

    def __init__(self, stub, pb, version):
        self.call = stub.Watch(pb.AgentListRequest(protocol_version=version))
        self.q = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        try:
            for msg in self.call:
                self.q.put(msg)
        except grpc.RpcError as e:
            self.q.put(e)

    def next(self, what):
        try:
            msg = self.q.get(timeout=TIMEOUT)
        except queue.Empty:
            fail(f"{what}: no watch message within {TIMEOUT}s")
        if isinstance(msg, grpc.RpcError):
            fail(f"{what}: the watch ended: {msg.code()} {msg.details()}")
        return msg

    def until(self, pred, what):
        while True:
            msg = self.next(what)
            if pred(msg):
                return msg


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--stubs", required=True)
    ap.add_argument("--protocol-version", type=int, required=True)
    ap.add_argument("--role", default="ingress")
    ap.add_argument("--claim", default="egress-python")
    ap.add_argument("--claim-ip", required=True)
    args = ap.parse_args()
    sys.path.insert(0, args.stubs)
    from dipam.v1 import dipam_pb2 as pb
    from dipam.v1 import dipam_pb2_grpc as pb_grpc

    v = args.protocol_version
    summary = {}
    # No options: the authority C-core picks for a unix target is what must work.
    channel = grpc.insecure_channel(f"unix:{args.socket}")

    health = health_pb2_grpc.HealthStub(channel)
    for name in ["", "dipam.v1.Agent", "dipam.v1.Cni", "dipam.v1.Admin"]:
        r = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=TIMEOUT)
        check(
            r.status == health_pb2.HealthCheckResponse.SERVING,
            f"health of {name!r}: {health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)}",
        )
    try:
        health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=TIMEOUT)
        fail("health of an unknown service answered")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.NOT_FOUND, f"unknown service: {e.code()}")
    summary["health"] = "SERVING"

    # Discovery as grpcurl does it: the services, then one's methods, from the server alone.
    db = ProtoReflectionDescriptorDatabase(channel)
    services = sorted(db.get_services())
    for want in ["dipam.v1.Cni", "dipam.v1.Admin", "dipam.v1.Agent", "grpc.health.v1.Health"]:
        check(want in services, f"reflection lists {services}, not {want}")
    agent = DescriptorPool(db).FindServiceByName("dipam.v1.Agent")
    methods = sorted(m.name for m in agent.methods)
    check("Watch" in methods and "List" in methods, f"reflection: Agent has {methods}")
    summary["services"] = services

    stub = pb_grpc.AgentStub(channel)
    listed = stub.List(pb.AgentListRequest(protocol_version=v), timeout=TIMEOUT)
    check(listed.protocol_version >= 1, f"List: protocol_version {listed.protocol_version}")
    summary["list"] = rows(listed)

    watch = Watcher(stub, pb, v)
    first = watch.next("first watch message")
    check(rows(first) == rows(listed), f"watch began with {rows(first)}, List said {rows(listed)}")
    check(first.generation >= 1, f"generation {first.generation}")

    role = args.role
    check(all(a.role != role for a in listed.addresses), f"{role} is already enabled")
    reply = stub.Allocate(pb.AgentRoleRequest(protocol_version=v, role=role), timeout=TIMEOUT)
    mine = [a for a in reply.addresses if a.role == role]
    check(mine and all(a.ip and a.state == "ready" for a in mine), f"Allocate({role}): {rows(reply)}")
    seen = watch.until(
        lambda m: any(a.role == role and a.state == "ready" for a in m.addresses),
        f"{role} ready on the watch",
    )
    check(seen.generation > first.generation, "generation did not increase")
    summary["allocated"] = sorted(a.ip for a in mine)
    summary["with_role"] = rows(stub.List(pb.AgentListRequest(protocol_version=v), timeout=TIMEOUT))

    stub.Release(pb.AgentRoleRequest(protocol_version=v, role=role), timeout=TIMEOUT)
    watch.until(lambda m: all(a.role != role for a in m.addresses), f"{role} gone from the watch")
    after = stub.List(pb.AgentListRequest(protocol_version=v), timeout=TIMEOUT)
    check(rows(after) == rows(listed), f"after Release: {rows(after)}, before: {rows(listed)}")

    # A claim of its own: a requested IP and labels, established before the reply.
    name, want_ip = args.claim, args.claim_ip
    labels = {"purpose": "egress", "example.com/policy": "p1"}
    req = pb.ClaimRequest(
        protocol_version=v,
        name=name,
        family=pb.ADDRESS_FAMILY_IPV4,
        ip=want_ip,
        labels=labels,
    )
    claimed = stub.Claim(req, timeout=TIMEOUT)
    c = claimed.claim
    check(
        c.claim_state == pb.CLAIM_STATE_READY,
        f"Claim: {pb.ClaimState.Name(c.claim_state)} {c.message}",
    )
    check(c.ip.split("/")[0] == want_ip, f"Claim: got {c.ip}, asked for {want_ip}")
    check(c.name == name and c.requested_ip == want_ip, f"Claim: {c}")
    check(dict(c.labels) == labels, f"Claim labels: {dict(c.labels)}")
    check(c.address_family == pb.ADDRESS_FAMILY_IPV4, f"Claim family: {c.address_family}")
    check(claimed.instance_id != "", "Claim: no instance id")
    seen = watch.until(
        lambda m: any(a.name == name and a.claim_state == pb.CLAIM_STATE_READY for a in m.addresses),
        f"claim {name} ready on the watch",
    )
    check(seen.instance_id == claimed.instance_id, "the watch and Claim name different instances")
    on_watch = [a for a in seen.addresses if a.name == name][0]
    check(dict(on_watch.labels) == labels, f"labels on the watch: {dict(on_watch.labels)}")
    # The same request again is the same claim: same address, no second allocation.
    again = stub.Claim(req, timeout=TIMEOUT).claim
    check(again.ip == c.ip, f"Claim again: {again.ip}, first {c.ip}")
    summary["claimed"] = c.ip
    summary["claim_listed"] = sorted(
        (a.name, a.ip, a.state) for a in stub.List(pb.AgentListRequest(protocol_version=v), timeout=TIMEOUT).addresses
    )

    gone = stub.Unclaim(pb.UnclaimRequest(protocol_version=v, name=name), timeout=TIMEOUT).claim
    check(
        gone.claim_state == pb.CLAIM_STATE_RELEASED,
        f"Unclaim: {pb.ClaimState.Name(gone.claim_state)} {gone.message}",
    )
    watch.until(lambda m: all(a.name != name for a in m.addresses), f"claim {name} gone from the watch")
    twice = stub.Unclaim(pb.UnclaimRequest(protocol_version=v, name=name), timeout=TIMEOUT).claim
    check(twice.claim_state == pb.CLAIM_STATE_RELEASED, "Unclaim of a gone claim is not RELEASED")

    # Requests dipamd refuses arrive as gRPC statuses with the documented codes.
    def code_of(call, what):
        try:
            call()
        except grpc.RpcError as e:
            return e.code().name
        fail(f"{what} succeeded")

    summary["codes"] = {
        "unknown_role": code_of(
            lambda: stub.Allocate(pb.AgentRoleRequest(protocol_version=v, role="no-such-role"), timeout=TIMEOUT),
            "Allocate of an unknown role",
        ),
        "bad_name": code_of(
            lambda: stub.Claim(pb.ClaimRequest(protocol_version=v, name="Not_A_Name"), timeout=TIMEOUT),
            "Claim of a bad name",
        ),
        "bad_ip": code_of(
            lambda: stub.Claim(pb.ClaimRequest(protocol_version=v, name="x", ip="10.0.0.300"), timeout=TIMEOUT),
            "Claim of a bad IP",
        ),
        "no_protocol_version": code_of(
            lambda: stub.List(pb.AgentListRequest(), timeout=TIMEOUT),
            "List without protocol_version",
        ),
    }

    watch.call.cancel()
    channel.close()
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
