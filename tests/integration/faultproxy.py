"""tests/integration/faultproxy.py - a fault-injecting HTTP/1.1 proxy for S3 tests.

Listens on a free 127.0.0.1 port and forwards each request to one upstream (s3rver)
over a kept-alive connection of its own. Per request a policy picks an action:

  pass    forward the request, relay the response
  503     do not forward; answer 503 with an S3 <Error><Code>SlowDown</Code> body
          (the connection stays usable, as with S3)
  500     the same with InternalError
  reset   read the request, then reset the connection (RST, SO_LINGER 0), no response
  cut     forward, send the response head and part of the body, then reset
  stall   forward, send the response head and part of the body, then send nothing
          (until stall_seconds pass or the proxy stops), then reset
  trickle forward the whole response, its body trickle_bytes at a time with
          trickle_seconds of silence before each piece (a slow, live server)
  200err  do not forward; answer 200 OK with an S3 <Error><Code>InternalError</Code> body,
          as S3 may for CompleteMultipartUpload, CopyObject and UploadPartCopy

drop_get_headers leaves the named response headers out of every answer to a GET.

Enough HTTP/1.1 for keep-alive: request bodies by Content-Length or chunked (an
`Expect: 100-continue` is answered by the proxy itself), response bodies by
Content-Length, chunked or close-delimited, none for HEAD/1xx/204/304.

Policies are callables `policy(req) -> action` where req has .method, .target, .path,
.query, .headers (lower-case names), .range and .seq. Ready-made ones below count each
distinct request (method, target, end of Range) and by default fault only its first
attempt, so a client that retries at least once always gets through; a resumed
ranged GET (same end, later start) counts as the same request.

With credentials=(key_id, secret) the proxy also checks each request's AWS SigV4
signature the way S3 does (s3rver 3.7.1 does not check V4 signatures at all) and answers
403 SignatureDoesNotMatch / InvalidAccessKeyId / XAmzContentSHA256Mismatch / AccessDenied
itself; .rejected counts those. credentials may also be a callable lookup(headers) ->
(key_id, secret) or (None, (code, message)) for temporary credentials: it sees the
x-amz-security-token header and rejects unknown or expired tokens (ExpiredToken and
InvalidToken are answered 400, as S3 does); .tokens counts the tokens of accepted requests.

Standalone: python3 faultproxy.py UPSTREAM_PORT [--p503 P] [--pcut P] [--preset P]
"""

import collections
import hashlib
import hmac
import random
import socket
import struct
import threading
import time
import urllib.parse
import uuid

ACTIONS = ("pass", "503", "500", "reset", "cut", "stall", "200err", "trickle")


class Request:
    __slots__ = ("method", "target", "path", "query", "headers", "range", "seq", "version")

    def __init__(self, method, target, version, headers, seq):
        self.method = method
        self.target = target
        self.version = version
        self.path, _, self.query = target.partition("?")
        self.headers = headers
        self.range = headers.get("range", "")
        self.seq = seq

    def identity(self):
        """What makes a retry "the same request": method, target and the end of the range."""
        end = self.range.rpartition("-")[2] if self.range else ""
        return (self.method, self.target, end)

    def is_object_get(self):
        """A GetObject: GET /bucket/key (not a bucket-level list)."""
        parts = self.path.lstrip("/").split("/", 1)
        return self.method == "GET" and len(parts) == 2 and parts[1] != ""

    def __repr__(self):
        return f"{self.method} {self.target} {self.range}".strip()


# --------------------------------------------------------------------------- policies


class _Limited:
    """Shared bookkeeping: which requests are eligible, first-attempt-only, a fault cap."""

    def __init__(self, match=None, first_attempt_only=True, limit=None):
        self.match = match or (lambda req: True)
        self.first_attempt_only = first_attempt_only
        self.limit = limit
        self.injected = 0
        self._faulted = set()
        self._lock = threading.Lock()

    def _choose(self, req):  # override: the fault to inject, or None
        raise NotImplementedError

    def __call__(self, req):
        with self._lock:
            if not self.match(req):
                return "pass"
            if self.limit is not None and self.injected >= self.limit:
                return "pass"
            ident = req.identity()
            if self.first_attempt_only and ident in self._faulted:
                return "pass"
            action = self._choose(req)
            if not action or action == "pass":
                return "pass"
            self._faulted.add(ident)
            self.injected += 1
            return action


class RandomFaults(_Limited):
    """Each eligible request gets fault A with probability weights[A] (seeded); the
    first len(first) eligible requests get the actions in `first` (so a short run
    still sees each kind)."""

    def __init__(self, weights, seed=0, first=(), **kw):
        super().__init__(**kw)
        assert sum(weights.values()) <= 1.0 and set(weights) <= set(ACTIONS)
        self.weights = dict(weights)
        self.rng = random.Random(seed)
        self.first = list(first)

    def _choose(self, req):
        if self.first:
            return self.first.pop(0)
        x = self.rng.random()
        for action, p in sorted(self.weights.items()):
            if x < p:
                return action
            x -= p
        return None


class EveryNth(_Limited):
    """Every n-th eligible request (in arrival order) gets the next action of a cycle."""

    def __init__(self, actions, n=3, **kw):
        super().__init__(**kw)
        self.actions = [actions] if isinstance(actions, str) else list(actions)
        self.n = n
        self.count = 0

    def _choose(self, req):
        self.count += 1
        if self.count % self.n:
            return None
        return self.actions[(self.count // self.n - 1) % len(self.actions)]


class Always(_Limited):
    """Every eligible request gets `action`, every attempt."""

    def __init__(self, action, **kw):
        kw.setdefault("first_attempt_only", False)
        super().__init__(**kw)
        self.action = action

    def _choose(self, req):
        return self.action


def passthrough(req):
    return "pass"


# --------------------------------------------------------------------------- wire


class _Closed(Exception):
    """The peer closed the connection (cleanly, between messages)."""


class _Conn:
    """A socket with a read buffer."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = bytearray()

    def _fill(self):
        b = self.sock.recv(256 * 1024)
        if not b:
            raise _Closed()
        self.buf += b

    def readline(self, limit=65536):
        while True:
            i = self.buf.find(b"\n")
            if i >= 0:
                line = bytes(self.buf[: i + 1])
                del self.buf[: i + 1]
                return line
            if len(self.buf) > limit:
                raise ValueError("header line too long")
            self._fill()

    def read_some(self, n):
        if not self.buf:
            self._fill()
        b = bytes(self.buf[:n])
        del self.buf[:n]
        return b

    def read_exact(self, n):
        while len(self.buf) < n:
            self._fill()
        b = bytes(self.buf[:n])
        del self.buf[:n]
        return b

    def sendall(self, b):
        self.sock.sendall(b)

    def reset(self):
        """Abort with RST instead of FIN."""
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.close()

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def _read_head(conn):
    """(start line, [(name, value)]) of the next message; _Closed at a clean EOF."""
    line = conn.readline()
    while line in (b"\r\n", b"\n"):  # tolerate stray CRLF between messages
        line = conn.readline()
    start = line.decode("latin-1").rstrip("\r\n")
    headers = []
    while True:
        h = conn.readline().decode("latin-1").rstrip("\r\n")
        if not h:
            return start, headers
        name, _, value = h.partition(":")
        headers.append((name.strip(), value.strip()))


def _hdict(headers):
    return {k.lower(): v for k, v in headers}


def _head_bytes(start, headers):
    return (start + "\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n").encode("latin-1")


def _read_chunked(conn, sink=None):
    """Read a chunked body, passing the raw bytes to sink; returns them if sink is None."""
    raw = bytearray()
    emit = sink or raw.extend
    while True:
        line = conn.readline()
        emit(line)
        size = int(line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while True:  # trailers up to the empty line
                t = conn.readline()
                emit(t)
                if t in (b"\r\n", b"\n"):
                    return bytes(raw)
        left = size + 2  # data + CRLF
        while left:
            b = conn.read_some(min(left, 256 * 1024))
            emit(b)
            left -= len(b)


def _error_body(code, message, resource):
    rid = uuid.uuid4().hex[:16].upper()
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
            f"<Message>{message}</Message><Resource>{resource}</Resource>"
            f"<RequestId>{rid}</RequestId></Error>").encode(), rid


# --------------------------------------------------------------------------- SigV4


_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def _uri_encode(s, safe):
    return urllib.parse.quote(s, safe=safe)  # RFC 3986 unreserved are never quoted


def sigv4_check(method, target, headers, body, key_id, secret, service="s3"):
    """S3's check of an AWS4-HMAC-SHA256 Authorization header.

    Returns None if the request is correctly signed, else (S3 error code, message).
    The canonical URI and query are rebuilt from the decoded request target, as S3
    does, so a client that encodes differently from the rules fails here too.
    """
    auth = headers.get("authorization")
    if not auth:
        return ("AccessDenied", "Access Denied (anonymous request)")
    if not auth.startswith("AWS4-HMAC-SHA256 "):
        return ("InvalidRequest", f"unsupported authorization {auth.split(' ')[0]!r}")
    fields = {}
    for part in auth[len("AWS4-HMAC-SHA256 "):].split(","):
        k, _, v = part.strip().partition("=")
        fields[k] = v
    try:
        akid, date, region, service, term = fields["Credential"].split("/")
        signed = fields["SignedHeaders"].split(";")
        sig = fields["Signature"]
    except (KeyError, ValueError):
        return ("AuthorizationHeaderMalformed", f"malformed Authorization: {auth!r}")
    if akid != key_id:
        return ("InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist in our records.")
    if "host" not in signed or signed != sorted(signed):
        return ("SignatureDoesNotMatch", f"SignedHeaders must include host and be sorted: {signed}")
    amzdate = headers.get("x-amz-date", "")
    if not amzdate.startswith(date) or term != "aws4_request" or fields["Credential"].split("/")[3] != service:
        return ("SignatureDoesNotMatch", f"bad scope {fields['Credential']} for x-amz-date {amzdate!r}")
    payload = headers.get("x-amz-content-sha256")
    if payload is None:
        return ("InvalidRequest", "Missing required header for this request: x-amz-content-sha256")
    if payload not in ("UNSIGNED-PAYLOAD", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD") and \
            payload != hashlib.sha256(body).hexdigest():
        return ("XAmzContentSHA256Mismatch", "The provided 'x-amz-content-sha256' header does not match what was computed.")
    path, _, query = target.partition("?")
    curi = _uri_encode(urllib.parse.unquote(path), "/-_.~")
    params = []
    for item in query.split("&") if query else []:
        k, _, v = item.partition("=")
        params.append((_uri_encode(urllib.parse.unquote(k), "-_.~"), _uri_encode(urllib.parse.unquote(v), "-_.~")))
    cquery = "&".join(f"{k}={v}" for k, v in sorted(params))
    cheaders = ""
    for name in signed:
        if name not in headers:
            return ("SignatureDoesNotMatch", f"signed header {name!r} not in the request")
        cheaders += f"{name}:{' '.join(headers[name].split())}\n"
    creq = "\n".join([method, curi, cquery, cheaders, ";".join(signed), payload])
    scope = f"{date}/{region}/{service}/{term}"
    sts = "\n".join(["AWS4-HMAC-SHA256", amzdate, scope, hashlib.sha256(creq.encode()).hexdigest()])
    k = ("AWS4" + secret).encode()
    for part in (date, region, fields["Credential"].split("/")[3], term):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    want = hmac.new(k, sts.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(want, sig):
        return ("SignatureDoesNotMatch",
                "The request signature we calculated does not match the signature you provided. "
                f"CanonicalRequest: {creq!r}")
    return None


# --------------------------------------------------------------------------- proxy


class FaultProxy:
    def __init__(self, upstream_port, upstream_host="127.0.0.1", policy=None,
                 stall_seconds=60.0, cut_fraction=None, seed=0, credentials=None,
                 trickle_bytes=64 * 1024, trickle_seconds=1.0, drop_get_headers=()):
        self.upstream = (upstream_host, upstream_port)
        # response headers (lower-case names) left out of answers to GETs: "etag" makes the
        # store look like a static file server in front of S3 (nginx with etag off)
        self.drop_get_headers = frozenset(drop_get_headers)
        self.credentials = credentials  # (key_id, secret): check SigV4 like S3
        self.rejected = collections.Counter()  # S3 error code -> count (signature checks)
        self.tokens = collections.Counter()  # x-amz-security-token of accepted requests
        self.policy = policy or passthrough
        self.stall_seconds = stall_seconds
        self.trickle_bytes = trickle_bytes
        self.trickle_seconds = trickle_seconds
        self.cut_fraction = cut_fraction  # None = a seeded random point in the body
        self.rng = random.Random(seed)
        self.counts = collections.Counter()  # action -> times applied
        self.log = collections.deque(maxlen=2000)  # (seq, repr(req), action, status)
        self._lock = threading.Lock()
        self._seq = 0
        self._stop = threading.Event()
        self._conns = set()
        self._lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._lsock.bind(("127.0.0.1", 0))
        self._lsock.listen(128)
        self.port = self._lsock.getsockname()[1]
        self._thread = None

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.port}"

    def set_policy(self, policy):
        self.policy = policy or passthrough

    def start(self):
        self._thread = threading.Thread(target=self._accept_loop, daemon=True, name="faultproxy")
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        try:
            self._lsock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._lsock.close()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()
        if self._thread:
            self._thread.join(5)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def summary(self):
        return dict(self.counts)

    # -- internals

    def _track(self, conn, add=True):
        with self._lock:
            (self._conns.add if add else self._conns.discard)(conn)

    def _accept_loop(self):
        while not self._stop.is_set():
            try:
                sock, _ = self._lsock.accept()
            except OSError:
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._serve, args=(_Conn(sock),), daemon=True).start()

    def _connect_upstream(self):
        s = socket.create_connection(self.upstream, timeout=30)
        s.settimeout(None)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        c = _Conn(s)
        self._track(c)
        return c

    def _serve(self, client):
        self._track(client)
        up = None
        try:
            while not self._stop.is_set():
                try:
                    start, headers = _read_head(client)
                except (_Closed, OSError):
                    return
                method, target, version = (start.split(" ", 2) + ["", ""])[:3]
                h = _hdict(headers)
                # request body
                if h.get("expect", "").lower() == "100-continue":
                    headers = [(k, v) for k, v in headers if k.lower() != "expect"]
                    client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                if "chunked" in h.get("transfer-encoding", "").lower():
                    body = _read_chunked(client)
                else:
                    body = client.read_exact(int(h.get("content-length", "0") or 0))
                with self._lock:
                    self._seq += 1
                    req = Request(method, target, version, h, self._seq)
                try:
                    action = self.policy(req)
                except Exception as e:  # a broken policy must not hang the client
                    action = "reset"
                    self.log.append((req.seq, repr(req), f"policy error {e!r}", None))
                assert action in ACTIONS, action
                client_close = h.get("connection", "").lower() == "close" or version == "HTTP/1.0"
                if self.credentials:
                    creds = self.credentials(h) if callable(self.credentials) else self.credentials
                    bad = creds[1] if creds[0] is None else sigv4_check(method, target, h, body, *creds)
                    if not bad:
                        self.tokens[h.get("x-amz-security-token")] += 1
                    if bad:
                        status = "400 Bad Request" if bad[0] in ("ExpiredToken", "InvalidToken") else "403 Forbidden"
                        self.rejected[bad[0]] += 1
                        payload, rid = _error_body(bad[0], bad[1].replace("&", "&amp;").replace("<", "&lt;"), req.path)
                        rh = [("Content-Type", "application/xml"), ("x-amz-request-id", rid),
                              ("Content-Length", "0" if method == "HEAD" else str(len(payload)))]
                        client.sendall(_head_bytes("HTTP/1.1 " + status, rh) + (b"" if method == "HEAD" else payload))
                        self.log.append((req.seq, repr(req), "sigv4:" + bad[0], int(status[:3])))
                        continue
                self.counts[action] += 1

                if action in ("503", "500", "200err"):
                    code, msg, status = (("SlowDown", "Please reduce your request rate.", "503 Slow Down")
                                         if action == "503" else
                                         ("InternalError", "We encountered an internal error. Please try again.",
                                          "500 Internal Server Error" if action == "500" else "200 OK"))
                    payload, rid = _error_body(code, msg, req.path)
                    rh = [("Content-Type", "application/xml"), ("x-amz-request-id", rid),
                          ("Content-Length", "0" if method == "HEAD" else str(len(payload)))]
                    if client_close:
                        rh.append(("Connection", "close"))
                    client.sendall(_head_bytes(f"HTTP/1.1 {status}", rh) + (b"" if method == "HEAD" else payload))
                    self.log.append((req.seq, repr(req), action, int(status[:3])))
                    if client_close:
                        return
                    continue
                if action == "reset":
                    self.log.append((req.seq, repr(req), action, None))
                    client.reset()
                    return

                # forward (pass / cut / stall); reconnect once if a kept-alive upstream
                # connection turns out to be closed before it answered
                raw_req = _head_bytes(start, headers) + body  # chunked bodies keep their framing
                for attempt in (0, 1):
                    fresh = up is None
                    try:
                        if up is None:
                            up = self._connect_upstream()
                        up.sendall(raw_req)
                        rstart, rheaders = _read_head(up)
                        break
                    except (_Closed, OSError):
                        if up is not None:
                            self._track(up, False)
                            up.close()
                            up = None
                        if fresh or attempt == 1:
                            # upstream down: the client sees a reset, as from a dead server
                            self.log.append((req.seq, repr(req), action + "/upstream-down", None))
                            client.reset()
                            return
                if method == "GET" and self.drop_get_headers:
                    rheaders = [(k, v) for k, v in rheaders if k.lower() not in self.drop_get_headers]
                rh = _hdict(rheaders)
                status = int((rstart.split(" ") + ["0", "0"])[1])
                self.log.append((req.seq, repr(req), action, status))
                head = _head_bytes(rstart, rheaders)
                no_body = method == "HEAD" or status in (204, 304) or 100 <= status < 200
                chunked = "chunked" in rh.get("transfer-encoding", "").lower()
                length = None if (no_body or chunked) else rh.get("content-length")
                length = int(length) if length is not None else None
                up_close = rh.get("connection", "").lower() == "close" or (
                    not no_body and not chunked and length is None)

                if action in ("cut", "stall") and not no_body and (length is None or length > 0):
                    total = length if length is not None else 1 << 20
                    frac = self.cut_fraction if self.cut_fraction is not None else self.rng.random()
                    keep = min(total - 1, int(total * frac)) if total else 0
                    client.sendall(head)
                    sent = 0
                    while sent < keep:
                        b = up.read_some(min(keep - sent, 256 * 1024))
                        client.sendall(b)
                        sent += len(b)
                    self._track(up, False)
                    up.close()  # the rest of the body is never read: drop the connection
                    up = None
                    if action == "stall":
                        self._stop.wait(self.stall_seconds)
                    client.reset()
                    return
                if action in ("cut", "stall"):  # nothing to cut (HEAD, empty body): reset instead
                    self._track(up, False)
                    up.close()
                    up = None
                    client.reset()
                    return

                client.sendall(head)
                if no_body:
                    pass
                elif action == "trickle" and length is not None:
                    left = length
                    while left > 0:
                        if self._stop.wait(self.trickle_seconds):
                            client.reset()
                            return
                        b = up.read_exact(min(left, self.trickle_bytes))
                        client.sendall(b)
                        left -= len(b)
                elif chunked:
                    _read_chunked(up, client.sendall)
                elif length is not None:
                    left = length
                    while left:
                        b = up.read_some(min(left, 256 * 1024))
                        client.sendall(b)
                        left -= len(b)
                else:  # close-delimited
                    try:
                        while True:
                            client.sendall(up.read_some(256 * 1024))
                    except _Closed:
                        pass
                if up_close:
                    self._track(up, False)
                    up.close()
                    up = None
                    if not no_body and not chunked and length is None:
                        client.close()
                        return
                if client_close:
                    return
        except (_Closed, OSError, ValueError):
            return
        finally:
            if up is not None:
                self._track(up, False)
                up.close()
            self._track(client, False)
            client.close()


def main(argv=None):
    import argparse

    ap = argparse.ArgumentParser(description="fault-injecting HTTP proxy for s3rver")
    ap.add_argument("upstream_port", type=int)
    ap.add_argument("--seed", type=int, default=0)
    for a in ("503", "cut", "reset", "stall"):
        ap.add_argument(f"--p{a}", type=float, default=0.0)
    ns = ap.parse_args(argv)
    weights = {a: getattr(ns, f"p{a}") for a in ("503", "cut", "reset", "stall") if getattr(ns, f"p{a}")}
    proxy = FaultProxy(ns.upstream_port, policy=RandomFaults(weights, seed=ns.seed) if weights else None)
    proxy.start()
    print(f"listening on {proxy.endpoint} -> 127.0.0.1:{ns.upstream_port}", flush=True)
    try:
        while True:
            time.sleep(5)
            print(proxy.summary(), flush=True)
    except KeyboardInterrupt:
        proxy.stop()


if __name__ == "__main__":
    main()
