#!/usr/bin/env python3
"""Server instructions per call, counted by valgrind's callgrind (issue 21).

Usage: python3 bench/callgrind_calls.py /path/to/svc LABEL   (run from the repository root)

Starts the server under `valgrind --tool=callgrind` (any build; a debug build works), then for
each kind of call: 20 warm-up calls, `callgrind_control -z` (zero the counters), 200 calls on
one keep-alive connection, `callgrind_control -d` (dump), and prints the server's instructions
(all threads) divided by the calls. Instruction counts do not depend on machine load, so two
builds compare on a busy machine. Calls: REST /health/live and authenticated
GET /api/v1/apikeys (http.client), the gRPC health Check and an authenticated
EventService.Emit (python grpcio, hand-encoded messages). Needs valgrind and python3-grpcio.
"""
import base64, glob, http.client, os, re, shutil, subprocess, sys, tempfile, time
binary, label = sys.argv[1], sys.argv[2]
port = 18580 if label == "before" else 18680
os.makedirs("target", exist_ok=True)
root = tempfile.mkdtemp(prefix=f"cg-{label}-", dir=os.path.abspath("target"))
key = "svc_" + "A1b2C3d4E5" * 4
config = f"{root}/server.yaml"
open(config, "w").write(
    f"data_dir: {root}/data\nlisten: {{http: 127.0.0.1:{port}, grpc: 127.0.0.1:{port+1}, bus: 127.0.0.1:{port+2}}}\n"
    f"hmacsecret: bench\nmaster_key: {base64.b64encode(os.urandom(32)).decode()}\n"
    "rate_limit: {requests_per_second: 1000000000, burst: 1000000000}\nlog_level: warn\n")
out = f"{root}/cg.out"
proc = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", binary,
                         "server", "--config", config],
                        env={"PATH": os.environ["PATH"], "SVC_BOOTSTRAP_API_KEY": key},
                        stdout=subprocess.DEVNULL, stderr=open(f"{root}/log", "w"))
def get(conn, path, auth=True):
    conn.request("GET", path, headers={"Authorization": f"Bearer {key}"} if auth else {})
    r = conn.getresponse(); r.read(); return r.status
deadline = time.time() + 600
while True:
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        if get(c, "/health/ready", False) == 200: break
    except OSError: pass
    if time.time() > deadline: sys.exit("no start")
    time.sleep(1)
def total():
    before = set(glob.glob(out + "*"))
    subprocess.run(["callgrind_control", "-d", str(proc.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(2)
    new = sorted(set(glob.glob(out + "*")) - before)
    text = open(new[-1]).read()
    return int(re.search(r"^summary:\s+(\d+)", text, re.M).group(1))
N = 200
for name, work in [
    ("GET /health/live", lambda c: [get(c, "/health/live", False) for _ in range(N)]),
    ("GET /api/v1/apikeys", lambda c: [get(c, "/api/v1/apikeys") for _ in range(N)]),
]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    work(c)  # warm
    subprocess.run(["callgrind_control", "-z", str(proc.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    work(c)
    print(f"{label} {name}: {total()/N:,.0f} instructions per call", flush=True)
import grpc
def field(number, text):
    data = text.encode()
    return bytes([number << 3 | 2, len(data)]) + data
request = field(1, "command_completed") + field(3, "cg") + field(4, '{"exit_code":0}')
channel = grpc.insecure_channel(f"127.0.0.1:{port+1}")
emit_call = channel.unary_unary("/svc.v1.EventService/Emit")
check = channel.unary_unary("/grpc.health.v1.Health/Check")
meta = [("authorization", f"Bearer {key}")]
health_request = field(1, "svc.v1.EventService")
for name, work in [
    ("gRPC health Check", lambda: check(health_request, timeout=60)),
    ("gRPC Emit", lambda: emit_call(request, metadata=meta, timeout=60)),
]:
    for _ in range(20): work()
    subprocess.run(["callgrind_control", "-z", str(proc.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(N): work()
    print(f"{label} {name}: {total()/N:,.0f} instructions per call", flush=True)
proc.terminate(); proc.wait()
shutil.rmtree(root)
