"""tests/integration/credserver.py - a fake credentials service on 127.0.0.1 for the
credentials tests: IMDSv2, a container credentials endpoint, STS and a source for a
credential_process helper, all in one threaded http.server.

Every answer hands out a new generation of temporary credentials that expire `lifetime`
seconds later. The key id is always the test s3rver's (s3rver checks key ids, not
signatures); the secret and the session token are new each time. The S3 side is checked
by a FaultProxy whose credentials= is this server's lookup(): a request must carry a
token this server issued, be signed with that token's secret, and arrive before it
expires (else 400 ExpiredToken / InvalidToken, 403 SignatureDoesNotMatch). Requests with
no token are checked against the static test keys.

  IMDS       PUT /latest/api/token (X-aws-ec2-metadata-token-ttl-seconds required),
             GET /latest/meta-data/iam/security-credentials/[ROLE] (token required)
  container  GET /container (Authorization must equal container_token, if set)
  STS        POST /sts: AssumeRoleWithWebIdentity (WebIdentityToken must equal
             web_token) or AssumeRole (SigV4 for service sts checked with the static keys)
  process    GET /process: credential_process JSON (Version 1)

Set broken[source] = "500" / "garbage" / "denied" to make one source fail.
.hits counts requests per source; .issued lists (source, token, expiry).
"""

import collections
import datetime
import http.server
import json
import threading
import time
import urllib.parse
import uuid

import faultproxy
import harness

ROLE = "ckptfs-test-role"


def iso(t):
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class CredServer:
    def __init__(self, lifetime=3600, web_token="web-identity-jwt", container_token=None):
        self.lifetime = lifetime
        self.web_token = web_token
        self.container_token = container_token
        self.hits = collections.Counter()
        self.issued = []  # (source, token, expires)
        self.secrets = {}  # token -> (secret, expires)
        self.broken = {}
        self.imds_tokens = set()
        self._lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _send(self, status, body, ctype="application/json"):
                b = body.encode() if isinstance(body, str) else body
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(b)))
                self.end_headers()
                self.wfile.write(b)

            def do_PUT(self):
                outer._dispatch(self, "PUT")

            def do_GET(self):
                outer._dispatch(self, "GET")

            def do_POST(self):
                outer._dispatch(self, "POST")

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = None

    # -- credentials

    def _issue(self, source):
        with self._lock:
            n = len(self.issued) + 1
            token = f"{source}-gen{n}-token-{uuid.uuid4().hex}"
            secret = f"{source}-gen{n}-secret-{uuid.uuid4().hex[:12]}"
            expires = int(time.time()) + self.lifetime
            self.issued.append((source, token, expires))
            self.secrets[token] = (secret, expires)
        return harness.S3_KEY, secret, token, expires

    def lookup(self, headers):
        """FaultProxy credentials= callable: (key_id, secret) or (None, (code, message))."""
        token = headers.get("x-amz-security-token")
        if token is None:
            return harness.S3_KEY, harness.S3_SECRET
        with self._lock:
            entry = self.secrets.get(token)
        if entry is None:
            return None, ("InvalidToken", "The provided token is malformed or otherwise invalid.")
        if time.time() >= entry[1]:
            return None, ("ExpiredToken", "The provided token has expired.")
        return harness.S3_KEY, entry[0]

    def generations(self, source=None):
        return [t for s, t, _ in self.issued if source in (None, s)]

    # -- HTTP

    def _dispatch(self, h, method):
        n = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(n) if n else b""
        path = urllib.parse.urlsplit(h.path).path
        if path.startswith("/latest/"):
            return self._imds(h, method, path)
        source = {"/container": "container", "/sts": "sts", "/process": "process"}.get(path)
        if not source:
            return h._send(404, "not found", "text/plain")
        if source != "sts":  # STS counts per action (sts-web, sts-role)
            self.hits[source] += 1
        how = self.broken.get(source)
        if how == "500":
            return h._send(500, "internal error", "text/plain")
        if how == "garbage":
            return h._send(200, "<html>not credentials</html>", "text/html")
        if source == "container":
            if self.container_token and h.headers.get("Authorization") != self.container_token:
                return h._send(401, '{"message":"bad authorization"}')
            kid, secret, token, exp = self._issue("container")
            return h._send(200, json.dumps({"AccessKeyId": kid, "SecretAccessKey": secret,
                                            "Token": token, "Expiration": iso(exp),
                                            "RoleArn": "arn:aws:iam::1:role/c"}))
        if source == "process":
            kid, secret, token, exp = self._issue("process")
            return h._send(200, json.dumps({"Version": 1, "AccessKeyId": kid, "SecretAccessKey": secret,
                                            "SessionToken": token, "Expiration": iso(exp)}))
        return self._sts(h, method, body)

    def _sts_error(self, h, status, code, msg):
        h._send(status, f"<ErrorResponse><Error><Type>Sender</Type><Code>{code}</Code>"
                        f"<Message>{msg}</Message></Error><RequestId>x</RequestId></ErrorResponse>",
                "text/xml")

    def _sts(self, h, method, body):
        if method != "POST":
            return self._sts_error(h, 405, "MethodNotAllowed", "POST only")
        q = dict(urllib.parse.parse_qsl(body.decode()))
        action = q.get("Action")
        if self.broken.get("sts") == "denied" or not q.get("RoleArn") or not q.get("RoleSessionName"):
            return self._sts_error(h, 403, "AccessDenied", "Not authorized to perform sts:AssumeRole")
        if action == "AssumeRoleWithWebIdentity":
            self.hits["sts-web"] += 1
            if q.get("WebIdentityToken") != self.web_token:
                return self._sts_error(h, 400, "InvalidIdentityToken", "Couldn't verify the token")
            source = "web"
        elif action == "AssumeRole":
            self.hits["sts-role"] += 1
            hd = {k.lower(): v for k, v in h.headers.items()}
            bad = faultproxy.sigv4_check("POST", h.path, hd, body, harness.S3_KEY, harness.S3_SECRET,
                                         service="sts")
            if bad:
                return self._sts_error(h, 403, bad[0], bad[1][:200].replace("<", "&lt;"))
            source = "role"
        else:
            return self._sts_error(h, 400, "InvalidAction", f"unknown action {action}")
        kid, secret, token, exp = self._issue(source)
        h._send(200, f"<{action}Response xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\">"
                     f"<{action}Result><Credentials><AccessKeyId>{kid}</AccessKeyId>"
                     f"<SecretAccessKey>{secret}</SecretAccessKey><SessionToken>{token}</SessionToken>"
                     f"<Expiration>{iso(exp)}</Expiration></Credentials></{action}Result>"
                     f"</{action}Response>", "text/xml")

    def _imds(self, h, method, path):
        self.hits["imds"] += 1
        how = self.broken.get("imds")
        if path == "/latest/api/token":
            if method != "PUT" or not h.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                return h._send(400, "", "text/plain")
            tok = uuid.uuid4().hex
            self.imds_tokens.add(tok)
            return h._send(200, tok, "text/plain")
        if h.headers.get("X-aws-ec2-metadata-token") not in self.imds_tokens:
            return h._send(401, "", "text/plain")
        base = "/latest/meta-data/iam/security-credentials/"
        if path == base:
            if how == "norole":
                return h._send(404, "", "text/plain")
            return h._send(200, ROLE, "text/plain")
        if path == base + ROLE:
            if how == "garbage":
                return h._send(200, "{not json", "text/plain")
            kid, secret, token, exp = self._issue("imds")
            return h._send(200, json.dumps({"Code": "Success", "LastUpdated": iso(time.time()),
                                            "Type": "AWS-HMAC", "AccessKeyId": kid,
                                            "SecretAccessKey": secret, "Token": token,
                                            "Expiration": iso(exp)}))
        return h._send(404, "", "text/plain")

    # -- life cycle

    def start(self):
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self):
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread:
            self._thread.join(5)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False
