"""A real Redis Cluster for tests and benchmarks: `masters` x (1 + replicas)
redis-server processes (redis_harness.RedisServer: free loopback ports, own
directories, stopped by PID) in cluster mode, joined by
`redis-cli --cluster create ... --cluster-replicas N --cluster-yes`.

    cluster = RedisCluster(masters=3, replicas=1)   # 6 nodes, state ok
    cluster.url                                     # redis-cluster://127.0.0.1:p0,...
    cluster.master_of_key("epd:v:{<hex>}")          # the RedisServer serving it
    cluster.kill(node); cluster.wait_promoted(node) # a failover
    cluster.reshard(src, dst, slots)                # redis-cli --cluster reshard
    cluster.begin_move(slot, src, dst); cluster.finish_move(slot, dst)  # one slot, by hand
    cluster.close()

The cluster bus port of each node is chosen free too (--cluster-port): the
default, port + 10000, does not exist above port 55535. cluster-node-timeout
is 1000 ms so a failover takes a couple of seconds.

Not a test module (pytest collects only test_*.py)."""

import shutil
import subprocess
import tempfile
import time
from typing import Dict, List, Optional

import redis_harness as rh
import server_harness as h


def redis_cli() -> Optional[str]:
    return shutil.which("redis-cli")


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class RedisCluster:
    def __init__(self, masters: int = 3, replicas: int = 1, node_timeout_ms: int = 1000):
        self.dir = tempfile.mkdtemp(prefix="epd-redis-cluster-")
        count = masters * (1 + replicas)
        ports = h.free_ports(2 * count)
        self.nodes: List[rh.RedisServer] = []
        self.dead: List[rh.RedisServer] = []
        try:
            for i in range(count):
                node = rh.RedisServer(f"{self.dir}/n{i}", extra=[
                    "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", str(node_timeout_ms), "--cluster-port", str(ports[count + i]),
                    "--repl-diskless-sync-delay", "0"])
                node.port = ports[i]
                node.start()
                self.nodes.append(node)
            addresses = [f"127.0.0.1:{n.port}" for n in self.nodes]
            subprocess.run([redis_cli(), "--cluster", "create", *addresses, "--cluster-replicas", str(replicas),
                            "--cluster-yes"], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           timeout=60)
            self.wait_ok()
            self.wait_formed(masters, count)
        except Exception:
            self.close()
            raise

    @property
    def url(self) -> str:
        return "redis-cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes if n.proc is not None)

    def live(self) -> List[rh.RedisServer]:
        return [n for n in self.nodes if n.proc is not None]

    def cluster_nodes(self) -> List[Dict]:
        """CLUSTER NODES as seen by a live node: id, port, flags, master id, slots."""
        return self._nodes_seen_by(self.live()[0])

    @staticmethod
    def _nodes_seen_by(node: rh.RedisServer) -> List[Dict]:
        out = []
        for line in _text(node.command("CLUSTER", "NODES")).splitlines():
            f = line.split()
            port = int(f[1].split("@")[0].rsplit(":", 1)[1])
            out.append({"id": f[0], "port": port, "flags": f[2].split(","), "master": f[3], "slots": f[8:]})
        return out

    def node_by_port(self, port: int) -> rh.RedisServer:
        return next(n for n in self.nodes if n.port == port)

    def node_id(self, node: rh.RedisServer) -> str:
        return _text(node.command("CLUSTER", "MYID"))

    def masters(self) -> List[rh.RedisServer]:
        return [self.node_by_port(e["port"]) for e in self.cluster_nodes()
                if "master" in e["flags"] and "fail" not in e["flags"] and e["slots"]]

    def replica_of(self, master: rh.RedisServer) -> rh.RedisServer:
        mid = self.node_id(master)
        return next(self.node_by_port(e["port"]) for e in self.cluster_nodes() if e["master"] == mid)

    def master_of_key(self, key: str) -> rh.RedisServer:
        """The master serving `key`, as the cluster says (CLUSTER KEYSLOT, then
        CLUSTER SLOTS)."""
        node = self.live()[0]
        slot = int(node.command("CLUSTER", "KEYSLOT", key))
        for first, last, master, *_ in node.command("CLUSTER", "SLOTS"):
            if first <= slot <= last:
                return self.node_by_port(int(master[1]))
        raise AssertionError(f"no master serves slot {slot}")

    def wait_ok(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            infos = [_text(n.command("CLUSTER", "INFO")) for n in self.live()]
            if all("cluster_state:ok" in i for i in infos):
                return
            time.sleep(0.05)
        raise AssertionError("the Redis Cluster did not reach state ok")

    def wait_formed(self, masters: int, count: int, timeout: float = 30.0) -> None:
        """Until every node knows every other, each replica's link to its
        master is up, and every node sees `masters` masters with slots (a
        replica whose first sync is unfinished would not be promoted)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ok = all(f"cluster_known_nodes:{count}" in _text(n.command("CLUSTER", "INFO")) for n in self.nodes)
            for n in self.nodes if ok else []:
                info = _text(n.command("INFO", "replication"))
                ok = ok and ("role:master" in info or "master_link_status:up" in info)
                roles = [e for e in self._nodes_seen_by(n) if "master" in e["flags"] and e["slots"]]
                ok = ok and len(roles) == masters
            if ok:
                return
            time.sleep(0.05)
        raise AssertionError("the Redis Cluster did not form (replicas unsynced or nodes unknown)")

    def wait_synced(self, master: rh.RedisServer, timeout: float = 20.0) -> None:
        """Until master's replica holds as many keys as the master."""
        replica = self.replica_of(master)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if replica.dbsize() == master.dbsize():
                return
            time.sleep(0.05)
        raise AssertionError("the replica did not catch up")

    def kill(self, node: rh.RedisServer) -> None:
        """SIGKILL by PID, as a crash."""
        node.kill()
        self.dead.append(node)

    def wait_promoted(self, replica: rh.RedisServer, timeout: float = 30.0) -> None:
        """Until `replica` is a master with slots and the cluster is ok."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if replica in self.masters():
                self.wait_ok(max(1.0, deadline - time.monotonic()))
                return
            time.sleep(0.05)
        raise AssertionError("the replica was not promoted")

    def reshard(self, source: rh.RedisServer, target: rh.RedisServer, slots: int) -> None:
        """Moves `slots` slots with their keys, as an operator would."""
        subprocess.run([redis_cli(), "--cluster", "reshard", f"127.0.0.1:{source.port}",
                        "--cluster-from", self.node_id(source), "--cluster-to", self.node_id(target),
                        "--cluster-slots", str(slots), "--cluster-yes"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)

    def begin_move(self, slot: int, source: rh.RedisServer, target: rh.RedisServer) -> None:
        """The first step of moving one slot, as a reshard takes it: from here
        on `source` answers ASK for the slot's keys it does not hold."""
        target.command("CLUSTER", "SETSLOT", slot, "IMPORTING", self.node_id(source))
        source.command("CLUSTER", "SETSLOT", slot, "MIGRATING", self.node_id(target))

    def finish_move(self, slot: int, target: rh.RedisServer) -> None:
        """The last step: every master learns that `target` serves the slot."""
        for m in self.masters():
            m.command("CLUSTER", "SETSLOT", slot, "NODE", self.node_id(target))

    def close(self) -> None:
        for n in self.nodes:
            n.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
