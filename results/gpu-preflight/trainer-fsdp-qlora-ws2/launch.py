"""Run repro.py under torchrun (2 ranks) with REPRO knobs; on timeout SIGABRT every rank (faulthandler stacks)."""
import os, signal, subprocess, sys, time, json, pathlib
knobs, out, timeout = sys.argv[1], pathlib.Path(sys.argv[2]), float(sys.argv[3])
out.mkdir(parents=True, exist_ok=True)
tag = f"REPRO_TAG={out.name}"
env = dict(os.environ, REPRO=knobs, PYTHONFAULTHANDLER="1", PYTHONUNBUFFERED="1", REPRO_TAG=out.name)
t0 = time.time()
p = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                      f"--log-dir={out}/logs", "--redirects=3", os.path.abspath(".scratch/hang/repro.py")],
                     env=env, stdout=open(out / "torchrun.out", "w"), stderr=subprocess.STDOUT, start_new_session=True)
def tagged():
    pids = []
    for d in pathlib.Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if tag.encode() in (d / "environ").read_bytes().split(b"\0"):
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids
try:
    rc = p.wait(timeout=timeout); status = "exit"
except subprocess.TimeoutExpired:
    status = "timeout"
    ranks = [q for q in tagged() if q != p.pid]
    # which ranks still exist and what state (to tell a rank that left Python)
    states = {}
    for q in ranks:
        try:
            states[q] = [l for l in open(f"/proc/{q}/status") if l.startswith(("Name", "State"))]
            states[q].append(open(f"/proc/{q}/cmdline").read().replace("\0", " ")[:200])
            states[q].append(open(f"/proc/{q}/wchan").read())
        except OSError:
            pass
    (out / "procs.json").write_text(json.dumps(states, indent=1))
    for q in ranks:
        try: os.kill(q, signal.SIGABRT)
        except OSError: pass
    time.sleep(5)
    for q in tagged():
        try: os.kill(q, signal.SIGKILL)
        except OSError: pass
    rc = p.wait()
print(json.dumps({"knobs": knobs, "status": status, "rc": rc, "s": round(time.time() - t0, 1)}))
