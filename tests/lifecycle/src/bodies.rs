//! A hostile allowed uid that makes dipamd buffer request bodies: as nobody (uid 65534, through
//! `setpriv`), Debian's python3 opens `conns` HTTP/2 connections to dipamd's socket, starts
//! `streams` gRPC `Cni/Add` calls on each, and sends `bytes` of each call's body within the
//! flow-control windows dipamd grants, never ending a body. It answers pings and settings as
//! a real client does, so that only dipamd's limits stop it. A stand-in for a real gRPC
//! client: none lets a caller leave a message unfinished on purpose.

use std::path::Path;

use crate::flood::Attacker;

const SCRIPT: &str = r#"
import socket, struct, sys, threading, time
path, conns, streams, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def frame(kind, flags, sid, payload):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", sid) + payload
def lit(name, value):
    n, v = name.encode(), value.encode()
    return b"\x00" + bytes([len(n)]) + n + bytes([len(v)]) + v
HEADERS = b"".join(lit(k, v) for k, v in [(":method", "POST"), (":scheme", "http"),
    (":path", "/dipam.v1.Cni/Add"), (":authority", "localhost"),
    ("content-type", "application/grpc"), ("te", "trailers")])
def recv_exact(s, n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise OSError("closed")
        b += c
    return b
class Conn:
    def __init__(self):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.connect(path)
        self.lock = threading.Condition()
        self.wlock = threading.Lock()
        self.conn_win, self.init_win = 65535, 65535
        self.win, self.sent, self.dead = {}, {}, set()
        self.closed = False
        self.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, b""))
        threading.Thread(target=self.read, daemon=True).start()
    def write(self, b):
        with self.wlock:
            self.s.sendall(b)
    def read(self):
        try:
            while True:
                h = recv_exact(self.s, 9)
                n, kind, flags = int.from_bytes(h[:3], "big"), h[3], h[4]
                sid = int.from_bytes(h[5:9], "big") & 0x7fffffff
                p = recv_exact(self.s, n)
                with self.lock:
                    if kind == 4 and not flags & 1:
                        for i in range(0, len(p), 6):
                            k, v = struct.unpack(">HI", p[i:i+6])
                            if k == 4:
                                for x in self.win:
                                    self.win[x] += v - self.init_win
                                self.init_win = v
                        self.write(frame(4, 1, 0, b""))
                    elif kind == 8:
                        inc = int.from_bytes(p[:4], "big") & 0x7fffffff
                        if sid == 0:
                            self.conn_win += inc
                        elif sid in self.win:
                            self.win[sid] += inc
                    elif kind == 6 and not flags & 1:
                        self.write(frame(6, 1, 0, p))
                    elif kind == 3 or (kind == 1 and flags & 1):
                        self.dead.add(sid)
                    elif kind == 7:
                        self.closed = True
                    self.lock.notify_all()
        except OSError:
            with self.lock:
                self.closed = True
                self.lock.notify_all()
    def open(self, sid):
        with self.lock:
            self.win[sid], self.sent[sid] = self.init_win, 0
        self.write(frame(1, 4, sid, HEADERS))
        self.write(frame(0, 0, sid, b"\x00" + struct.pack(">I", size + 1024)))
    def pump(self, deadline):
        while time.time() < deadline:
            with self.lock:
                todo = [x for x in self.win if x not in self.dead and self.sent[x] < size]
                if self.closed or not todo:
                    return
                ready = [x for x in todo if self.win[x] > 0] if self.conn_win > 0 else []
                if not ready:
                    self.lock.wait(0.2)
                    continue
                x = ready[0]
                n = min(16384, self.win[x], self.conn_win, size - self.sent[x])
                self.win[x] -= n
                self.conn_win -= n
                self.sent[x] += n
            try:
                self.write(frame(0, 0, x, b"\x00" * n))
            except OSError:
                return
cs = []
for _ in range(conns):
    try:
        c = Conn()
    except OSError:
        continue
    for i in range(streams):
        c.open(2 * i + 1)
    cs.append(c)
ts = [threading.Thread(target=c.pump, args=(time.time() + 30,)) for c in cs]
[t.start() for t in ts]
[t.join() for t in ts]
held = sum(v for c in cs for x, v in c.sent.items() if x not in c.dead)
print("held", len(cs), held, flush=True)
sys.stdin.read()
"#;

/// The running attacker; its connections close when it is dropped.
pub struct Bodies {
    _attacker: Attacker,
    /// Connections it opened.
    pub conns: usize,
    /// Body bytes it sent on streams dipamd did not reset.
    pub held: u64,
}

impl Bodies {
    /// Starts the attacker on `socket` and waits (30 s at most) until it has sent what the
    /// windows allow.
    pub fn start(socket: &Path, conns: usize, streams: usize, bytes: usize) -> Self {
        let mut args = vec![socket.display().to_string()];
        args.extend([conns, streams, bytes].map(|n| n.to_string()));
        let (attacker, line) = Attacker::start(SCRIPT, &args);
        let mut words = line.split_whitespace().skip(1).map(str::parse::<u64>);
        let (Some(Ok(conns)), Some(Ok(held))) = (words.next(), words.next()) else {
            panic!("the attacker did not report: {line:?}");
        };
        Self {
            _attacker: attacker,
            conns: usize::try_from(conns).unwrap_or(usize::MAX),
            held,
        }
    }
}
