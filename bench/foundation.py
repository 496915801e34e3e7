#!/usr/bin/env python3
"""Foundation benchmarks: start-to-ready, idle RSS, REST throughput with wrk.

Usage: python3 bench/foundation.py [--binary target/release/svc] [--seconds 10]

Runs the real server on loopback with a temporary data dir. Start-up is measured on an
existing data dir (migrations already applied), from spawn to the first /health/ready 200,
polling every 0.5 ms. Throughput uses wrk (Debian package `wrk`) with 2 threads and 64
connections, for the authenticated GET /api/v1/apikeys and, as the ceiling, /health/live.
The rate limit is raised for the run, since the default (50 req/s per key) would measure
the limiter instead of the server.
"""
import argparse, base64, json, os, re, shutil, socket, statistics, subprocess, sys, tempfile, time

def http_status(port, path):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            data = s.recv(64)
            return int(data.split()[1])
    except OSError:
        return None

def start(binary, config, env):
    return subprocess.Popen([binary, "--config", config], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", default="target/release/svc")
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    binary_dir = tempfile.mkdtemp()
    server = os.path.join(binary_dir, "svc-server")
    os.symlink(os.path.abspath(args.binary), server)
    data = tempfile.mkdtemp()
    port = 18480
    config = os.path.join(data, "server.yaml")
    with open(config, "w") as f:
        f.write(f"data_dir: {data}/data\nlisten: {{http: 127.0.0.1:{port}, grpc: 127.0.0.1:{port+1}, bus: 127.0.0.1:{port+2}}}\n"
                f"hmacsecret: bench\nmaster_key: {base64.b64encode(os.urandom(32)).decode()}\n"
                "rate_limit: {requests_per_second: 1000000000, burst: 1000000000}\nlog_level: warn\n")
    env = {"PATH": os.environ["PATH"]}

    size = os.path.getsize(args.binary)
    print(f"binary: {args.binary} {size/1e6:.1f} MB")

    # First start creates the data dir; later starts measure an existing one.
    proc = start(server, config, env)
    while http_status(port, "/health/ready") != 200:
        time.sleep(0.01)
    proc.terminate(); proc.wait()
    times = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        proc = start(server, config, env)
        while http_status(port, "/health/ready") != 200:
            time.sleep(0.0005)
        times.append((time.perf_counter() - t0) * 1000)
        proc.terminate(); proc.wait()
    print(f"start to ready (existing data dir, {args.runs} runs): median {statistics.median(times):.1f} ms, max {max(times):.1f} ms")

    proc = start(server, config, env)
    while http_status(port, "/health/ready") != 200:
        time.sleep(0.01)
    time.sleep(2)
    rss = int(re.search(r"VmRSS:\s+(\d+)", open(f"/proc/{proc.pid}/status").read()).group(1))
    print(f"idle RSS: {rss/1024:.1f} MiB")
    key = open(f"{data}/data/bootstrap-admin.key").read().strip()
    if shutil.which("wrk") is None:
        print("wrk not installed (apt-get install wrk): throughput skipped")
    else:
        for label, path, headers in [
            ("GET /api/v1/apikeys (authenticated)", "/api/v1/apikeys", ["-H", f"Authorization: Bearer {key}"]),
            ("GET /health/live (ceiling)", "/health/live", []),
        ]:
            out = subprocess.run(["wrk", "-t2", "-c64", f"-d{args.seconds}s", "--latency", *headers,
                                  f"http://127.0.0.1:{port}{path}"], capture_output=True, text=True).stdout
            rps = re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)
            p99 = re.search(r"Latency Distribution[\s\S]*?^\s+99%\s+(\S+)", out, re.M)
            non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
            print(f"{label}: {float(rps):,.0f} req/s, p99 {p99.group(1) if p99 else '?'}"
                  + (f", NON-2xx {non2xx.group(1)}" if non2xx else ""))
        rss = int(re.search(r"VmRSS:\s+(\d+)", open(f"/proc/{proc.pid}/status").read()).group(1))
        print(f"RSS after load: {rss/1024:.1f} MiB")
    proc.terminate(); proc.wait()
    shutil.rmtree(data); shutil.rmtree(binary_dir)

if __name__ == "__main__":
    sys.exit(main())
