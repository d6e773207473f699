#!/usr/bin/env python3
"""A media origin for the HTTP front's tests (not a test module): serves the
files of --dir over HTTP on --bind:--port (0 = any), plus

  /redirect?to=<url>   302 to <url>
  /slow/<file>         the file after --slow-s seconds

and prints "READY port=<p>" once it listens. Run and stopped by PID
(server_harness.start_origin / stop_pid)."""

import argparse
import functools
import http.server
import os
import time
import urllib.parse


class Handler(http.server.SimpleHTTPRequestHandler):
    slow_s = 5.0

    def log_message(self, *args):  # quiet: the tests read stdout for READY only
        pass

    def do_GET(self):
        url = urllib.parse.urlparse(self.path)
        if url.path == "/redirect":
            target = urllib.parse.parse_qs(url.query).get("to", [""])[0]
            self.send_response(302)
            self.send_header("Location", target)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if url.path.startswith("/slow/"):
            time.sleep(self.slow_s)
            self.path = url.path[len("/slow"):]
        super().do_GET()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bind", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--slow-s", type=float, default=5.0)
    a = ap.parse_args()
    Handler.slow_s = a.slow_s
    server = http.server.ThreadingHTTPServer((a.bind, a.port), functools.partial(Handler, directory=a.dir))
    print(f"READY port={server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
