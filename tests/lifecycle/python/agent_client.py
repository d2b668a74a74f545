"""An agent written against dipam.v1 with nothing but Python grpcio and stubs generated from
proto/ (tests/lifecycle/tests/agent/agent_api.rs generates them with grpcio-tools and runs this).

It connects as the grpcio documentation shows for a unix socket, with no channel option:
in particular no `grpc.default_authority`, so C-core sends the percent-encoded socket path as
`:authority` (grpc/grpc#34305), which dipamd must accept. Then it runs the steps of
tests/lifecycle/agent-scenarios.json, the table the Go client runs too (its "about" says what
each field means): health, discovery through server reflection, List, Watch, a role enabled
and seen on the watch, released and seen gone; a claim of its own (a requested IP, labels)
seen ready on the watch; dipamd killed with SIGKILL by the test and the watch reconnected to
the next dipamd, the same addresses in its first lists; the claim unclaimed and seen gone;
and the codes of requests dipamd refuses.

For kill_dipamd it prints DIPAM-KILL and waits for a line on stdin (the test restarts dipamd
in between). Every check fails with a message naming what differed; its findings go to stdout
as a DIPAM-SUMMARY line of JSON, which the Rust test compares with what dipamctl reports
(tests/lifecycle/src/scenario.rs).
"""

import argparse
import json
import queue
import sys
import threading
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from google.protobuf.descriptor_pool import DescriptorPool

TIMEOUT = 30.0
# What a watch reconnects after (docs/agent-api.md: UNAVAILABLE when dipamd stops; UNKNOWN
# or INTERNAL when the connection is cut mid-stream by a SIGKILL).
RECONNECT = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}


def fail(what):
    print(f"FAILED: {what}", file=sys.stderr)
    sys.exit(1)


def check(cond, what):
    if not cond:
        fail(what)


def rows(reply):
    """(role, family, ip, state) of every address, sorted: what an agent acts on."""
    return sorted([a.role, a.family, a.ip, a.state] for a in reply.addresses)


def named(reply):
    """(name, ip, state) of every address, sorted."""
    return sorted([a.name, a.ip, a.state] for a in reply.addresses)


class Watcher:
    """Agent.Watch read on its own thread, so that every wait has a bound. It reconnects when
    dipamd goes away and resumes by (instance_id, generation): a message of the same dipamd
    that is not newer is dropped; the first one of a new dipamd is passed on as restarted."""

    def __init__(self, stub, pb, version):
        self.stub, self.pb, self.version = stub, pb, version
        self.q = queue.Queue()
        self.call = None
        self.stopped = False
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        instance, generation = None, 0
        while not self.stopped:
            self.call = self.stub.Watch(self.pb.AgentListRequest(protocol_version=self.version))
            try:
                for msg in self.call:
                    if msg.instance_id == instance and msg.generation <= generation:
                        continue
                    restarted = instance is not None and msg.instance_id != instance
                    instance, generation = msg.instance_id, msg.generation
                    self.q.put((msg, restarted))
            except grpc.RpcError as e:
                if self.stopped or e.code() not in RECONNECT:
                    self.q.put((e, False))
                    return
            time.sleep(0.1)

    def next(self, what):
        try:
            msg, restarted = self.q.get(timeout=TIMEOUT)
        except queue.Empty:
            fail(f"{what}: no watch message within {TIMEOUT}s")
        if isinstance(msg, grpc.RpcError):
            fail(f"{what}: the watch ended: {msg.code()} {msg.details()}")
        return msg, restarted

    def until(self, pred, what):
        while True:
            msg, _ = self.next(what)
            if pred(msg):
                return msg

    def stop(self):
        self.stopped = True
        self.call.cancel()


class Runner:
    def __init__(self, args, pb, pb_grpc):
        self.pb, self.v = pb, args.protocol_version
        self.subst = {"{claim}": args.claim, "{claim_ip}": args.claim_ip, "{other_ip}": args.other_ip}
        # No options: the authority C-core picks for a unix target is what must work.
        self.channel = grpc.insecure_channel(f"unix:{args.socket}")
        self.stub = pb_grpc.AgentStub(self.channel)
        self.watch = None
        self.last = None
        self.ips = {}
        self.summary = {"codes": {}}

    def sub(self, value):
        return self.subst.get(value, value)

    def step(self, s):
        what = s["step"]
        try:
            got = getattr(self, "op_" + s["op"])(s)
        except grpc.RpcError as e:
            check("code" in s, f"{what}: {e.code().name} {e.details()}")
            check(e.code().name == s["code"], f"{what}: {e.code().name}, want {s['code']}")
            self.summary["codes"][what] = e.code().name
            return
        check("code" not in s, f"{what} succeeded, want {s.get('code')}")
        if "record" in s:
            self.summary[s["record"]] = got
        if "watch" in s:
            key = self.sub(s.get("name") or s.get("role"))
            present = s["watch"] == "present"

            def shown(m):
                there = [a for a in m.addresses if key in (a.name, a.role) and a.state == "ready"]
                gone = all(key not in (a.name, a.role) for a in m.addresses)
                return bool(there) if present else gone

            self.last = self.watch.until(shown, f"{what}: {key} {s['watch']} on the watch")

    def op_health(self, s):
        health = health_pb2_grpc.HealthStub(self.channel)
        r = health.Check(health_pb2.HealthCheckRequest(service=s["service"]), timeout=TIMEOUT)
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)
        check(status == s["want"], f"{s['step']}: {status}, want {s['want']}")
        self.summary["health"] = status

    def op_reflection(self, s):
        # Discovery as grpcurl does it: the services, then one's methods, from the server alone.
        db = ProtoReflectionDescriptorDatabase(self.channel)
        services = sorted(db.get_services())
        for want in s["services"]:
            check(want in services, f"reflection lists {services}, not {want}")
        agent = DescriptorPool(db).FindServiceByName("dipam.v1.Agent")
        methods = sorted(m.name for m in agent.methods)
        check(all(m in methods for m in s["methods"]), f"reflection: Agent has {methods}")
        return services

    def op_list(self, s):
        r = self.stub.List(self.pb.AgentListRequest(protocol_version=s.get("protocol_version", self.v)), timeout=TIMEOUT)
        check(r.protocol_version >= 1, f"List: protocol_version {r.protocol_version}")
        self.listed = r
        return rows(r)

    def op_watch(self, s):
        self.watch = Watcher(self.stub, self.pb, self.v)
        first, _ = self.watch.next("first watch message")
        check(rows(first) == rows(self.listed), f"watch began with {rows(first)}, List said {rows(self.listed)}")
        check(first.generation >= 1, f"generation {first.generation}")
        self.last = first

    def op_allocate(self, s):
        r = self.stub.Allocate(self.pb.AgentRoleRequest(protocol_version=self.v, role=s["role"]), timeout=TIMEOUT)
        mine = [a for a in r.addresses if a.role == s["role"]]
        if s.get("ready"):
            check(mine and all(a.ip and a.state == "ready" for a in mine), f"Allocate: {rows(r)}")
        return rows(self.stub.List(self.pb.AgentListRequest(protocol_version=self.v), timeout=TIMEOUT))

    def op_release(self, s):
        self.stub.Release(self.pb.AgentRoleRequest(protocol_version=self.v, role=s["role"]), timeout=TIMEOUT)

    def op_claim(self, s):
        pb = self.pb
        req = pb.ClaimRequest(
            protocol_version=self.v,
            name=self.sub(s["name"]),
            family=pb.AddressFamily.Value(s.get("family", "ADDRESS_FAMILY_UNSPECIFIED")),
            ip=self.sub(s.get("ip", "")),
            labels=s.get("labels", {}),
        )
        r = self.stub.Claim(req, timeout=TIMEOUT)
        c = r.claim
        state = pb.ClaimState.Name(c.claim_state)
        check(state == s["claim_state"], f"{s['step']}: {state} {c.message}")
        check(c.ip.split("/")[0] == req.ip, f"{s['step']}: got {c.ip}, asked for {req.ip}")
        check(c.name == req.name and c.requested_ip == req.ip, f"{s['step']}: {c}")
        check(dict(c.labels) == dict(req.labels), f"{s['step']} labels: {dict(c.labels)}")
        check(c.address_family == req.family, f"{s['step']} family: {c.address_family}")
        check(r.instance_id != "", f"{s['step']}: no instance id")
        if "same_ip_as" in s:
            check(c.ip == self.ips[s["same_ip_as"]], f"{s['step']}: {c.ip}, {s['same_ip_as']} had {self.ips[s['same_ip_as']]}")
        self.ips[s["step"]] = c.ip
        if s.get("record") == "claim_listed":
            return named(self.stub.List(pb.AgentListRequest(protocol_version=self.v), timeout=TIMEOUT))
        return c.ip

    def op_unclaim(self, s):
        r = self.stub.Unclaim(self.pb.UnclaimRequest(protocol_version=self.v, name=self.sub(s["name"])), timeout=TIMEOUT)
        state = self.pb.ClaimState.Name(r.claim.claim_state)
        check(state == s["claim_state"], f"{s['step']}: {state} {r.claim.message}")

    def op_kill_dipamd(self, s):
        before = self.last
        check(before.addresses, "nothing to follow across the restart")
        print("DIPAM-KILL", flush=True)
        check(sys.stdin.readline().strip() == "restarted", "the test did not restart dipamd")
        while True:
            msg, restarted = self.watch.next("the next dipamd's list")
            if restarted:
                break
        check(msg.instance_id != before.instance_id, "the restarted list has the old instance id")
        after = self.watch.until(lambda m: named(m) == named(before), "the same addresses after the restart") \
            if named(msg) != named(before) else msg
        self.last = after
        return {"before": named(before), "after": named(after)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--stubs", required=True)
    ap.add_argument("--scenarios", required=True)
    ap.add_argument("--protocol-version", type=int, required=True)
    ap.add_argument("--claim", required=True)
    ap.add_argument("--claim-ip", required=True)
    ap.add_argument("--other-ip", required=True)
    args = ap.parse_args()
    sys.path.insert(0, args.stubs)
    from dipam.v1 import agent_pb2 as pb
    from dipam.v1 import agent_pb2_grpc as pb_grpc

    with open(args.scenarios) as f:
        steps = json.load(f)["steps"]
    run = Runner(args, pb, pb_grpc)
    for s in steps:
        run.step(s)
    run.summary["steps"] = [s["step"] for s in steps]
    run.watch.stop()
    run.channel.close()
    print("DIPAM-SUMMARY " + json.dumps({"scenarios": run.summary}), flush=True)


if __name__ == "__main__":
    main()
