"""A testbed of network namespaces: N pretend hosts on one machine, joined by a bridge (root only).

Each host ``i`` is a namespace with a veth pair to a bridge in the root namespace, address
``10.77.0.{i+1}/24`` on its ``eth0``, and its own loopback. With ``rate`` set, both directions of
every host's link are capped by a token bucket (``tc qdisc ... tbf``; netem is not needed): the
namespace's egress on ``eth0``, its ingress on the bridge side of the pair, so each host has a
full-duplex link of that rate, like a NIC on a switch.

Everything gets names unique to this process, so several testbeds (of several test sessions) can
live side by side; the address plan is the same in each, which is fine because the bridges are
separate. Leaving the ``with`` block, by any exit, kills the processes started through the testbed
and deletes the namespaces and the bridge (the veth pairs go with their namespaces).

    with Testbed(4, rate="1gbit") as bed:
        bed.popen(0, ["python", "-m", "allreduce", ...], env={"RANK": "0", ...})
"""

from __future__ import annotations

import functools
import itertools
import os
import shutil
import subprocess

SUBNET = "10.77.0."
_serial = itertools.count()


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """Whether namespaces, veth pairs, a bridge and tbf can be set up here (root, ``ip``, ``tc``)."""
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        return False
    probe = f"arprobe{os.getpid()}"
    try:
        subprocess.run(["ip", "netns", "add", probe], check=True, capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=10)
    return True


class Testbed:
    """``n`` namespaces on one bridge; see the module docstring."""

    def __init__(self, n: int, rate: str | None = None, burst: str = "64kb", latency: str = "100ms"):
        if not 1 <= n <= 200:
            raise ValueError(f"a testbed has 1..200 hosts, got {n}")
        tag = f"{os.getpid() % 100000}{next(_serial)}"
        self.n, self.rate, self.burst, self.latency = n, rate, burst, latency
        self.bridge = f"arb{tag}"
        self.hosts = [f"ar-{tag}-{i}" for i in range(n)]  # namespace names
        self.addresses = [f"{SUBNET}{i + 1}" for i in range(n)]
        self._veth = [f"arv{tag}x{i}" for i in range(n)]  # bridge side of each pair
        self._procs: list[subprocess.Popen] = []
        self._made: list[list[str]] = []  # undo commands, run in reverse

    def __enter__(self) -> Testbed:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def run(self, i: int, cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
        """Run ``cmd`` inside host ``i`` and wait for it (``check=True`` unless told otherwise)."""
        kwargs.setdefault("check", True)
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(["ip", "netns", "exec", self.hosts[i], *cmd], **kwargs)

    def popen(self, i: int, cmd: list[str], env: dict | None = None, **kwargs) -> subprocess.Popen:
        """Start ``cmd`` inside host ``i`` with ``env`` added to this process's environment."""
        proc = subprocess.Popen(["ip", "netns", "exec", self.hosts[i], *cmd], env={**os.environ, **(env or {})},
                                **kwargs)
        self._procs.append(proc)
        return proc

    def close(self) -> None:
        """Kill what was started here, then delete the namespaces and the bridge."""
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self._procs.clear()
        while self._made:
            subprocess.run(self._made.pop(), capture_output=True, timeout=30)

    def _build(self) -> None:
        self._sh(["ip", "link", "add", self.bridge, "type", "bridge"], undo=["ip", "link", "del", self.bridge])
        self._sh(["ip", "link", "set", self.bridge, "up"])
        for i, (ns, veth) in enumerate(zip(self.hosts, self._veth)):
            self._sh(["ip", "netns", "add", ns], undo=["ip", "netns", "del", ns])
            inner = f"{veth}n"
            self._sh(["ip", "link", "add", veth, "type", "veth", "peer", "name", inner, "netns", ns])
            self._sh(["ip", "link", "set", veth, "master", self.bridge, "up"])
            inside = ["ip", "netns", "exec", ns]
            self._sh(inside + ["ip", "link", "set", inner, "name", "eth0"])
            self._sh(inside + ["ip", "addr", "add", f"{self.addresses[i]}/24", "dev", "eth0"])
            self._sh(inside + ["ip", "link", "set", "eth0", "up"])
            self._sh(inside + ["ip", "link", "set", "lo", "up"])
            if self.rate:
                shape = ["root", "tbf", "rate", self.rate, "burst", self.burst, "latency", self.latency]
                self._sh(inside + ["tc", "qdisc", "add", "dev", "eth0", *shape])
                self._sh(["tc", "qdisc", "add", "dev", veth, *shape])

    def _sh(self, cmd: list[str], undo: list[str] | None = None) -> None:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        if done.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip()}")
        if undo:
            self._made.append(undo)
