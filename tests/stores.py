# SPDX-License-Identifier: MIT
"""Real stores for the tests and benchmarks of datasets in object storage.

- Nginx: nginx serving a directory over HTTP on a free local port, with
  range requests, ETags and PUT (dav_methods), its access log counting
  requests.
- FaultProxy: an HTTP proxy in front of a store that answers 503, drops
  the connection half-way through a body, or stalls, now and then.
- Rgw: a single-node Ceph cluster with a RADOS Gateway (S3), started by
  tests/stores/rgw in a temporary directory.

Each is a context manager that stops what it started, by pid, also when
the test fails.
"""
import http.client
import http.server
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SKIP = 77


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc=None, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.05)
    return False


def have(prog):
    return shutil.which(prog) is not None or os.path.exists("/usr/sbin/" + prog)


def install(*pkgs):
    """apt-get install what is missing (root); False if it cannot be had."""
    missing = [p for p in pkgs if subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", p], capture_output=True,
        text=True).stdout.find("ok installed") < 0]
    if not missing:
        return True
    if os.geteuid() != 0:
        return False
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True)
    r = subprocess.run(["apt-get", "install", "-y", "-qq", *missing], env=env,
                       capture_output=True)
    return r.returncode == 0


class Nginx:
    """nginx serving root at http://127.0.0.1:PORT/, or (upstream=PORT) a
    reverse proxy in front of another server, for its access log: what
    requests() and bytes_sent() count."""

    def __init__(self, root=None, upstream=None, tls=False, auth=None):
        self.root = os.path.abspath(root) if root else None
        self.upstream = upstream
        self.tls = tls  # https with HTTP/2, a certificate of a CA of its own
        self.auth = auth  # (user, password): HTTP basic auth asked of all
        self.dir = None
        self.proc = None

    def __enter__(self):
        if not install("nginx"):
            print("skipped: nginx cannot be installed", file=sys.stderr)
            sys.exit(SKIP)
        self.dir = tempfile.mkdtemp(prefix="zfolio-nginx-")
        self.port = free_port()
        for d in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            os.mkdir(os.path.join(self.dir, d))
        listen = "127.0.0.1:%d" % self.port
        if self.tls:
            self._certificates()
            listen += " ssl http2;\n        ssl_certificate %s/srv.crt;\n" \
                "        ssl_certificate_key %s/srv.key" % (self.dir, self.dir)
        conf = os.path.join(self.dir, "nginx.conf")
        with open(conf, "w") as f:
            f.write("""
daemon off;
master_process off;
worker_processes 1;
pid %(d)s/nginx.pid;
error_log %(d)s/error.log;
events { worker_connections 1024; }
http {
    log_format counts '$status $body_bytes_sent $request_method $server_protocol';
    access_log %(d)s/access.log counts;
    client_body_temp_path %(d)s/body;
    proxy_temp_path %(d)s/proxy;
    fastcgi_temp_path %(d)s/fastcgi;
    uwsgi_temp_path %(d)s/uwsgi;
    scgi_temp_path %(d)s/scgi;
    sendfile on;
    keepalive_requests 1000000;
    keepalive_timeout 120s;
    client_max_body_size 0;
    server {
        listen %(listen)s;
        %(location)s
    }
}
""" % {"d": self.dir, "listen": listen, "location": self._location()})
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        self.proc = subprocess.Popen([nginx, "-c", conf, "-p", self.dir],
                                     stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        self.url = "%s://127.0.0.1:%d/" % ("https" if self.tls else "http",
                                            self.port)
        if not wait_port(self.port, self.proc):
            self.__exit__(None, None, None)
            raise RuntimeError("nginx did not start")
        return self

    def _certificates(self):
        """A CA of its own (self.ca) and a certificate for 127.0.0.1."""
        d = self.dir
        ssl = ["openssl", "req", "-nodes", "-newkey", "ec",
               "-pkeyopt", "ec_paramgen_curve:prime256v1"]
        subprocess.run(ssl + ["-x509", "-days", "2", "-keyout", d + "/ca.key",
                              "-out", d + "/ca.crt", "-subj", "/CN=zfolio test CA"],
                       check=True, capture_output=True)
        subprocess.run(ssl + ["-keyout", d + "/srv.key", "-out", d + "/srv.csr",
                              "-subj", "/CN=127.0.0.1"],
                       check=True, capture_output=True)
        with open(d + "/san", "w") as f:
            f.write("subjectAltName=IP:127.0.0.1\n")
        subprocess.run(["openssl", "x509", "-req", "-in", d + "/srv.csr", "-CA",
                        d + "/ca.crt", "-CAkey", d + "/ca.key", "-CAcreateserial",
                        "-days", "2", "-out", d + "/srv.crt", "-extfile",
                        d + "/san"], check=True, capture_output=True)
        self.ca = d + "/ca.crt"

    def protocols(self):
        """How many requests came by each protocol ("HTTP/2.0": n)."""
        out = {}
        for w in self._log():
            if len(w) > 3:
                out[w[3]] = out.get(w[3], 0) + 1
        return out

    def _location(self):
        if self.upstream:
            return """root %s;
        location / {
            proxy_pass http://127.0.0.1:%d;
            proxy_set_header Host $http_host;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
        }""" % (self.dir, self.upstream)
        auth = ""
        if self.auth:
            with open(self.dir + "/htpasswd", "w") as f:
                f.write("%s:{PLAIN}%s\n" % self.auth)
            auth = 'auth_basic "zfolio test"; auth_basic_user_file %s/htpasswd;' % self.dir
        return """root %s;
        location / {
            autoindex on;
            dav_methods PUT DELETE;
            create_full_put_path on;
            %s
        }""" % (self.root, auth)

    def _log(self):
        try:
            with open(os.path.join(self.dir, "access.log")) as f:
                return [line.split() for line in f]
        except OSError:
            return []

    def requests(self):
        """Requests served so far (lines of the access log)."""
        return len(self._log())

    def bytes_sent(self):
        """Body bytes sent so far."""
        return sum(int(w[1]) for w in self._log() if len(w) > 1)

    def __exit__(self, *exc):
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
        return False


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _forward(self):
        px = self.server.proxy
        n = px.count()
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        if px.every_503 and n % px.every_503 == 0:
            px.faults["503"] += 1
            msg = b"<Error><Code>SlowDown</Code></Error>"
            self.send_response(503)
            self.send_header("Content-Length", str(len(msg)))
            self.end_headers()
            self.wfile.write(msg)
            return
        if px.every_stall and n % px.every_stall == 0:
            px.faults["stall"] += 1
            time.sleep(px.stall_s)
        up = http.client.HTTPConnection("127.0.0.1", px.upstream_port,
                                        timeout=60)
        headers = {k: v for k, v in self.headers.items()
                   if k.lower() not in ("connection", "keep-alive")}
        up.request(self.command, self.path, body=body, headers=headers)
        resp = up.getresponse()
        data = resp.read()
        up.close()
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("connection", "keep-alive",
                                 "transfer-encoding", "content-length"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command == "HEAD":
            return
        if px.every_drop and n % px.every_drop == 0 and len(data) > 1:
            px.faults["drop"] += 1
            self.wfile.write(data[:len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(data)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # a client that gave up on a stalled answer: expected


class FaultProxy:
    """http://127.0.0.1:PORT/ in front of upstream_port: request n gets a
    503 if n % every_503 == 0, its body cut in half and the connection
    dropped if n % every_drop == 0, a stall of stall_s before the answer if
    n % every_stall == 0 (0: never)."""

    def __init__(self, upstream_port, every_503=0, every_drop=0,
                 every_stall=0, stall_s=0.0):
        self.upstream_port = upstream_port
        self.every_503, self.every_drop = every_503, every_drop
        self.every_stall, self.stall_s = every_stall, stall_s
        self.faults = {"503": 0, "drop": 0, "stall": 0}
        self._n = 0
        self._lock = threading.Lock()

    def count(self):
        with self._lock:
            self._n += 1
            return self._n

    def __enter__(self):
        self.server = _QuietServer(("127.0.0.1", 0), _ProxyHandler)
        self.server.daemon_threads = True
        self.server.proxy = self
        self.port = self.server.server_address[1]
        self.url = "http://127.0.0.1:%d/" % self.port
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        return False


class Rgw:
    """A single-node Ceph cluster with a RADOS Gateway: .env holds
    S3_ENDPOINT, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION."""

    SCRIPT = os.path.join(HERE, "stores", "rgw")

    def __enter__(self):
        self.dir = tempfile.mkdtemp(prefix="zfolio-rgw-")
        r = subprocess.run([self.SCRIPT, "start", self.dir],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, timeout=600)
        if r.returncode == SKIP:
            shutil.rmtree(self.dir, ignore_errors=True)
            print("skipped: " + r.stderr[-500:], file=sys.stderr)
            sys.exit(SKIP)
        if r.returncode != 0:
            self.__exit__(None, None, None)
            raise RuntimeError("rgw did not start: " + r.stderr[-2000:])
        self.env = dict(line.split("=", 1) for line in r.stdout.split()
                        if "=" in line)
        self.endpoint = self.env["S3_ENDPOINT"]
        return self

    def __exit__(self, *exc):
        subprocess.run([self.SCRIPT, "stop", self.dir], capture_output=True,
                       timeout=120)
        shutil.rmtree(self.dir, ignore_errors=True)
        return False
